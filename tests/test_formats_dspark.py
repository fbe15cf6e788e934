"""`export` of DSpark drafters: `speculators-dspark` (a Qwen3-style drafter as vLLM 0.32 reads a speculators dspark
checkpoint) and `stitched` (a release's DSpark stages written back under `mtp.*` in its own quantisation), each
validated as written, plus the launch lines they print.

vLLM 0.32's reading is checked here against `formats.dspark.vllm_view`, the facts read from its source
(`transformers_utils/configs/speculators/base.py` + `algos.py` update_dspark); tests/testing/test_engine_dspark.py
runs vLLM's own functions on the same export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.draft import dspark_disk as disk
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.formats import ExportConfig, check_format, formats_of
from mtp2draft.formats.dspark import vllm_view
from mtp2draft.formats.export import detect_format, export, validate
from mtp2draft.formats.serving import launch_lines
from mtp2draft.kinds import DraftKind

V, H, B = 40, 16, 3
TARGET = {"hidden_size": H, "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V, "max_position_embeddings": 128,
          "num_hidden_layers": 4}  # fmt: skip
FIELDS = DSparkFields(block_size=B, target_layer_ids=(0, 2), noise_token_id=39, markov_rank=5, n_routed_experts=None,
                      num_experts_per_tok=None, section="config.json")  # fmt: skip
RELEASE = "deepseek_v4_0731_dspark"


def _drafter(tmp_path: Path) -> tuple[Path, disk.DSparkDraft]:
    g = torch.Generator().manual_seed(7)
    draft = disk.new_dspark_draft(TARGET, FIELDS, 2, torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    with torch.no_grad():  # non-zero heads, so a dropped or misnamed tensor shows
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    src = tmp_path / "draft"
    src.mkdir()
    disk.save_dspark(draft, src, {"name_or_path": "old/name", "architectures": ["X"]})
    return src, draft


def test_speculators_dspark_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    src, draft = _drafter(tmp_path)
    out = tmp_path / "out"
    export(src, "speculators-dspark", out, config=ExportConfig(dtype="float32", verifier="org/Target"))
    assert validate(out) == [] and detect_format(json.loads((out / "config.json").read_text())) == "speculators-dspark"
    cfg = json.loads((out / "config.json").read_text())
    pre, spec = vllm_view(cfg)
    assert spec == {"method": "dspark", "num_speculative_tokens": B}  # one block per step, whatever -k said
    assert pre["architectures"] == ["Qwen3DSparkModel"] and pre["dspark_bonus_anchor"] is False
    assert pre["target_layer_ids"] == list(FIELDS.target_layer_ids) and pre["mask_token_id"] == FIELDS.noise_token_id
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/Target"
    stored = load_file(str(out / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in stored)  # vLLM shares the target's
    assert stored["confidence_head.proj.weight"].dtype == torch.float32
    back = disk.load_dspark(out, draft.embed_tokens.weight, draft.lm_head.weight)
    for k, v in draft.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert json.loads((out / "provenance.json").read_text())["export"]["speculative_tokens"] == B
    # the card and `run`'s summary print the same lines, k the block size
    from mtp2draft.hub.card import model_card, serve_text

    card, summary = str(model_card(out, "me/d")), "\n".join(serve_text(out))
    assert "from a DSpark block drafter" in card and "multi-token-prediction" not in card
    for text, draft in ((card, "me/d"), (summary, f"./{out}" if not str(out).startswith("/") else str(out))):
        assert f'"method": "dspark", "model": "{draft}", "num_speculative_tokens": {B}' in text
        assert f"--speculative-algorithm DSPARK --speculative-draft-model-path {draft}" in text


def test_speculators_dspark_bf16_keeps_the_confidence_head_fp32(tmp_path: Path) -> None:
    src, _ = _drafter(tmp_path)
    export(src, "speculators-dspark", tmp_path / "out", config=ExportConfig(verifier="org/T"))
    stored = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert stored["fc.weight"].dtype == torch.bfloat16 and stored["confidence_head.proj.bias"].dtype == torch.float32
    assert validate(tmp_path / "out") == []


@pytest.mark.parametrize(
    "plant, complaint",
    [
        (lambda c, w: c.update(sample_from_anchor=False), "fill-in layout"),
        (
            lambda c, w: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=B + 1),
            "not the block size",
        ),  # fmt: skip
        (lambda c, w: c.pop("aux_hidden_state_layer_ids"), "cannot read it as a dspark speculator"),
        (lambda c, w: c.update(mask_token_id=V), "mask_token_id 40 is not a token id"),
        (lambda c, w: c.update(architectures=["DSparkDraftModel"]), "architectures"),
        (lambda c, w: w.pop("markov_head.markov_w1.weight"), "markov_head.markov_w1.weight is missing"),
        (lambda c, w: w.update({"lm_head.weight": torch.zeros(V, H)}), "lm_head.weight is not a parameter"),
        (lambda c, w: w.update({"fc.weight": w["fc.weight"][:, :H].contiguous()}), "fc.weight has shape"),
        (
            lambda c, w: w.update({"confidence_head.proj.weight": w["confidence_head.proj.weight"].half()}),
            "expected float32",
        ),  # fmt: skip
    ],
)
def test_validate_names_what_vllm_would_misread(tmp_path: Path, plant, complaint: str) -> None:
    src, _ = _drafter(tmp_path)
    out = tmp_path / "out"
    export(src, "speculators-dspark", out, config=ExportConfig(dtype="float32", verifier="org/T"))
    cfg, weights = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    plant(cfg, weights)
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(out / "model.safetensors"))
    problems = validate(out, "speculators-dspark")
    assert any(complaint in p for p in problems), problems


def test_formats_take_the_dspark_kind() -> None:
    assert formats_of(DraftKind.DSPARK) == ["stitched", "speculators-dspark"]
    assert check_format("stitched", DraftKind.DSPARK) is DraftKind.MTP  # the overlay format takes both kinds
    with pytest.raises(DraftError, match="takes an EAGLE-3 draft; d is a DSpark draft .*speculators-dspark"):
        check_format("speculators", DraftKind.DSPARK, "d")
    with pytest.raises(DraftError, match="takes a DSpark draft; d is a native MTP draft"):
        check_format("speculators-dspark", DraftKind.MTP, "d")


def test_launch_lines_draft_one_block() -> None:
    lines = launch_lines("speculators-dspark", "org/T", "./d", B)
    assert '{"method": "dspark", "model": "./d", "num_speculative_tokens": 3}' in lines["vLLM"]
    assert (
        "--speculative-algorithm DSPARK" in lines["SGLang"] and "--speculative-dspark-block-size 3" in lines["SGLang"]
    )
    overlay = launch_lines("stitched-dspark", "org/T", "./d", 5)
    assert (
        list(overlay) == ["overlay", "vLLM", "SGLang"]
        and '"method": "dspark", "num_speculative_tokens": 5' in overlay["vLLM"]
    )


# ---- stitched: a release's DSpark stages ---------------------------------------------------------------------------
def _mtp(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = open_checkpoint(str(ckpt_dir))
    return dict(ckpt.iter_weights(ckpt.keys_with_prefix("mtp.")))


def _laid(target: Path, overlay: Path, where: Path) -> Path:
    """The target with the overlay's files copied over it (what the README's lines do)."""
    shutil.copytree(target, where)
    for f in overlay.iterdir():
        if f.suffix in (".safetensors", ".json") and f.name != "provenance.json":
            shutil.copyfile(f, where / f.name)
    return where


def _raw(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def test_stitched_writes_the_stages_back_in_the_release_quantisation(build, tmp_path: Path) -> None:
    release = build(RELEASE)
    conv = tmp_path / "conv"
    assert main(["convert", str(release), "--out", str(conv), "--dtype", "float32"]) == 0
    export(conv, "stitched", tmp_path / "same", target=str(release))
    assert validate(tmp_path / "same") == []
    cfg = json.loads((tmp_path / "same" / "config.json").read_text())
    assert detect_format(cfg) == "stitched-dspark"
    original, same = _raw(release), _raw(tmp_path / "same")
    assert {k for k in same if k.startswith("mtp.")} == {k for k in original if k.startswith("mtp.")}
    assert all(v.dtype == original[k].dtype and v.shape == original[k].shape for k, v in same.items())
    # untouched stages read back as shipped: the same values after dequantisation (scales may be re-chosen)
    shipped, back = _mtp(release), _mtp(_laid(release, tmp_path / "same", tmp_path / "laid-same"))
    assert all(torch.equal(back[k], v) for k, v in shipped.items())
    assert all(torch.equal(same[k], v) for k, v in original.items() if not k.startswith("mtp.") and k in same)
    # a changed drafter: written in the release's own quantisation, dequantising close to the change
    state = load_file(str(conv / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    changed = {k: v + 0.05 * v.abs().mean() * torch.randn(v.shape, generator=g) for k, v in state.items()}
    save_file(changed, str(conv / "model.safetensors"))
    export(conv, "stitched", tmp_path / "tuned", target=str(release))
    assert validate(tmp_path / "tuned") == []
    record = json.loads((tmp_path / "tuned" / "provenance.json").read_text())["export"]
    assert set(record["requantised"]) == {"fp8-e8m0", "fp4-e8m0"} and record["speculative_tokens"] == 5
    got = _mtp(_laid(release, tmp_path / "tuned", tmp_path / "laid"))
    for k, want in changed.items():
        assert got[k].dtype == torch.float32 and got[k].shape == want.shape, k
        err = (got[k] - want).abs().max() / want.abs().max().clamp_min(1e-12)
        assert err < 0.3, (k, float(err))  # FP4 e2m1 has 1 mantissa bit
    moved = [k for k in changed if not torch.equal(got[k], state[k])]
    assert len(moved) > len(changed) // 2
    readme = (tmp_path / "tuned" / "README.md").read_text()
    assert '"method": "dspark", "num_speculative_tokens": 5' in readme and "--speculative-dspark-block-size 5" in readme


def test_stitched_overlay_validation_catches_an_unmarked_shard(build, tmp_path: Path) -> None:
    release = build(RELEASE)
    conv, out = tmp_path / "conv", tmp_path / "out"
    assert main(["convert", str(release), "--out", str(conv), "--dtype", "float32"]) == 0
    export(conv, "stitched", out, target=str(release))
    shard = next(out.glob("*.safetensors"))
    shutil.copyfile(release / shard.name, shard)  # the release's own shard, as shipped
    assert any("as the release shipped them" in p for p in validate(out))


def test_refusals_name_the_other_format(build, tmp_path: Path) -> None:
    release = build(RELEASE)
    conv = tmp_path / "conv"
    assert main(["convert", str(release), "--out", str(conv)]) == 0
    with pytest.raises(DraftError, match="speculators' dspark type builds Qwen3-style layers only"):
        export(conv, "speculators-dspark", tmp_path / "a")
    src, _ = _drafter(tmp_path)
    with pytest.raises(DraftError, match="no release stores it under mtp"):
        export(src, "stitched", tmp_path / "b", target=str(release))
    with pytest.raises(DraftError, match="hidden_size 64, the drafter's is 16: not its drafter"):
        export(src, "speculators-dspark", tmp_path / "d", target=str(build("deepseek_v3")))
    other = build("deepseek_v4")
    with pytest.raises(DraftError, match="does not ship this DSpark drafter"):
        export(conv, "stitched", tmp_path / "c", target=str(other))
    assert not any((tmp_path / n).exists() for n in "abcd")
