"""The export stage: each engine format's exact layout, equivalence with the in-memory draft, the aux-layer-id rule
the engines apply, the native round trip through a stitched overlay, and a validator that catches every violation."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from family_table import FAMILIES
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.fixtures import FIXTURES, perturb_draft

from mtp2draft.checkpoint.fp8 import dequantize_fp8
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.draft.eagle3 import vocab_maps
from mtp2draft.draft.eagle3_config import NORM_SWITCHES
from mtp2draft.errors import DraftError, TensorError, ValidationError
from mtp2draft.formats import ExportConfig
from mtp2draft.formats.export import export, validate

# e4m3: 3 mantissa bits, so round-to-nearest is within half a step, 2^-4 of the value's binade; below the smallest
# normal (2^-6 * scale) the spacing is 2^-9 * scale, half of which is 2^-10 * scale.
E4M3_REL, E4M3_SUBNORMAL = 2.0**-4, 2.0**-10


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---- shared drafts (built once per module) ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def target6(build) -> Path:
    """A MiMo (Qwen2-trunk) target with 6 layers: the default aux ids [1, 2, 4] are distinct."""
    return build("mimo", num_hidden_layers=6)


@pytest.fixture(scope="module")
def eagle3(target6: Path, work: Path) -> Path:
    """An fp32 EAGLE-3 draft with a reduced draft vocabulary (what distill --draft-vocab-size writes)."""
    raw = work / "eagle3-raw"
    convert(str(target6), raw, to="eagle3", dtype="float32")
    out = work / "eagle3"
    shutil.copytree(raw, out)
    cfg = json.loads((out / "config.json").read_text())
    w = load_file(str(out / "model.safetensors"))
    used = torch.tensor(sorted(torch.randperm(cfg["vocab_size"], generator=torch.Generator().manual_seed(0))[:96]))
    w["lm_head.weight"] = w["lm_head.weight"][used].contiguous()
    w["d2t"], w["t2d"] = vocab_maps(used, cfg["vocab_size"])
    cfg["draft_vocab_size"] = int(used.numel())
    save_file(w, str(out / "model.safetensors"), {"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg))
    figures = {"name": "d", "acceptance_per_position": [0.5, 0.25], "mean_acceptance_length": 1.6}
    (out / "evaluation.json").write_text(json.dumps({"target": "x", "results": [figures]}))
    return out


@pytest.fixture(scope="module")
def sglang_dir(eagle3: Path, work: Path) -> Path:
    export(eagle3, "sglang", work / "sglang")
    return work / "sglang"


@pytest.fixture(scope="module")
def speculators_dir(eagle3: Path, work: Path) -> Path:
    export(eagle3, "speculators", work / "speculators", config=ExportConfig(speculative_tokens=4))
    return work / "speculators"


def _perturbed_native(build, work: Path, fixture: str, name: str) -> tuple[Path, Path]:
    """(target, native draft whose every floating tensor moved by a few %: a stand-in for a fine-tuned layer)."""
    target = build(fixture)
    draft = work / name
    if not draft.exists():
        convert(str(target), draft, to="mtp")
        shutil.copyfile(draft / "model.safetensors", work / f"{name}-src.safetensors")  # the unperturbed layer
        perturb_draft(draft)
    return target, draft


# ---- sglang / speculators layouts ----------------------------------------------------------------------------------
def test_sglang_export_has_the_exact_layout(eagle3: Path, sglang_dir: Path) -> None:
    cfg = json.loads((sglang_dir / "config.json").read_text())
    src = json.loads((eagle3 / "config.json").read_text())
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "max_position_embeddings",
        "hidden_act",
        "vocab_size",
        "draft_vocab_size",
        "target_hidden_size",
    ):
        assert cfg[key] == src[key], key
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False and cfg["draft_vocab_size"] == 96
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [1, 2, 4] and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5]
    w = load_file(str(sglang_dir / "model.safetensors"))
    assert "embed_tokens.weight" not in w and w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert tuple(w["d2t"].shape) == (96,) and tuple(w["t2d"].shape) == (cfg["vocab_size"],)
    assert {t.dtype for k, t in w.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}  # bf16 by default
    assert tuple(w["midlayer.self_attn.q_proj.weight"].shape)[1] == 2 * cfg["hidden_size"]
    prov = json.loads((sglang_dir / "provenance.json").read_text())
    assert prov["export"]["format"] == "sglang" and prov["spec"] == "mimo"  # the draft's provenance, extended
    assert (sglang_dir / "evaluation.json").is_file()  # travels with the export, for the model card
    assert validate(sglang_dir) == []


def test_speculators_export_config_and_names(eagle3: Path, speculators_dir: Path, target6: Path) -> None:
    cfg = json.loads((speculators_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["speculators_version"] == "0.7.0.1"  # the latest speculators release
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0] == {
        "proposal_type": "greedy",
        "speculative_tokens": 4,
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }
    # a plain local source has no hub id: its path, as it is (test_speculators_verifier_is_the_hub_id covers the rest)
    assert sc["verifier"] == {"name_or_path": str(target6), "architectures": ["MiMoForCausalLM"]}
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["vocab_size"] == 256 and layer["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 96 and cfg["target_hidden_size"] == 64
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5] and "eagle_config" not in cfg
    assert {k: cfg[k] for k in NORM_SWITCHES} == dict.fromkeys(NORM_SWITCHES, False)  # every switch, explicitly
    names = set(load_file(str(speculators_dir / "model.safetensors")))
    sglang = set(load_file(str(eagle3 / "model.safetensors")))
    assert names == {k.replace("midlayer.", "layers.0.") for k in sglang}
    assert validate(speculators_dir) == []


def _logits(draft, embed: torch.Tensor, features: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    draft.attach_target(embed)
    pos = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
    with torch.no_grad():
        logits, hidden = draft(ids, draft.initial_hidden(features), pos)
        logits2, _ = draft(ids, hidden, pos)  # a second step feeds back the first step's hidden
    return logits, logits2, draft.to_target_ids(logits.argmax(-1))


def test_exported_drafts_compute_the_same_logits(eagle3: Path, work: Path) -> None:
    export(eagle3, "sglang", work / "sg32", config=ExportConfig(dtype="float32"))
    export(eagle3, "speculators", work / "sp32", config=ExportConfig(dtype="float32"))
    gen = torch.Generator().manual_seed(0)
    mine = load_draft(eagle3)
    embed = torch.randn(mine.vocab_size, mine.hidden_size, generator=gen)
    features = torch.randn(2, 7, 3 * 64, generator=gen)
    ids = torch.randint(0, mine.vocab_size, (2, 7), generator=gen)
    want = _logits(mine, embed, features, ids)
    for path in (work / "sg32", work / "sp32"):
        got = _logits(load_draft(path), embed, features, ids)
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b), path  # fp32 export: bit-exact
    got = _logits(load_draft(work / "sglang"), embed, features, ids)  # the bf16 export: weights rounded once
    rel = (got[0] - want[0]).norm() / want[0].norm()
    assert rel < 2e-2, rel


# How SGLang 0.5.23 turns eagle_config ids into captured layer inputs, written out here from its sources (not from
# the spec, so a wrong spec fails): llama.py / qwen2.py / glm4_moe.py: [id + 1 for id in ids]; deepseek_v2.py
# (DeepseekV2ForCausalLM, inherited by V3 and V3.2): + 1 only when ids[0] == 1, the ids as they stand otherwise.
SGLANG_CAPTURES = {
    "qwen2": lambda ids: [i + 1 for i in ids],
    "deepseek_v2": lambda ids: [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids),
}


def _check_aux_capture(export_dir: Path, target: Path, sglang_captures) -> None:
    """Both engines' capture rules, simulated with hooks on the transformers target, select exactly the tensors
    mtp2draft's training feeds the draft (`TargetModel.features`: outputs of the draft's aux layers)."""
    from mtp2draft.target.hidden import TargetModel

    cfg = json.loads((export_dir / "config.json").read_text())
    sglang_ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    vllm_ids = cfg["eagle_aux_hidden_state_layer_ids"]
    tm = TargetModel(str(target))
    ids = torch.randint(0, tm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    aux = load_draft(export_dir).aux_layer_ids
    trained = tm.features(ids, aux_layers=aux, want_final=False).aux

    def capture_inputs_of(layers: list[int]) -> torch.Tensor:
        # Both engines append `hidden_states + residual` before running layer j: the residual stream entering j,
        # which is the transformers decoder layer's input. Neither captures the final layer's output.
        got: dict[int, torch.Tensor] = {}
        hooks = [
            tm._layers[j].register_forward_pre_hook(
                lambda _m, args, kwargs, j=j: got.__setitem__(j, (args[0] if args else kwargs["hidden_states"])),
                with_kwargs=True,
            )
            for j in layers
            if j < tm.num_layers
        ]
        with torch.no_grad():
            tm.model(input_ids=ids, use_cache=False)
        for h in hooks:
            h.remove()
        assert sorted(got) == sorted(layers), f"layers {layers} are not all capturable"
        return torch.cat([got[j] for j in layers], dim=-1)

    # SGLang: the family's set_eagle3_layers_to_capture
    assert torch.equal(capture_inputs_of(sglang_captures(sglang_ids)), trained)
    # vLLM: gpu_model_runner reads the top-level ids and captures before layer id, as is
    assert torch.equal(capture_inputs_of(vllm_ids), trained)
    # transformers' hidden_states[i + 1] is the output of layer i: the same tensors once more
    with torch.no_grad():
        hs = tm.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    assert torch.equal(torch.cat([hs[i + 1] for i in aux], dim=-1), trained)
    # the classic bug: the same ids in both places would make vLLM feed each layer's input, one layer early
    assert not torch.equal(capture_inputs_of([i - 1 for i in vllm_ids]), trained)


def test_aux_ids_select_the_layers_the_draft_was_trained_on(sglang_dir: Path, target6: Path) -> None:
    _check_aux_capture(sglang_dir, target6, SGLANG_CAPTURES["qwen2"])


@pytest.mark.parametrize(("aux", "written"), [([1, 2, 4], [1, 2, 4]), ([2, 3, 4], [3, 4, 5])])
def test_deepseek_aux_ids_follow_sglangs_conditional_plus_one(
    build, tmp_path: Path, aux: list[int], written: list[int]
) -> None:
    """SGLang adds 1 to a DeepSeek target's eagle_config ids only when the first is 1: ids from layer 1 are written
    as they are, ids from layer 2 up are written + 1 (SGLang then captures them as they stand). Written as the Llama
    rule has it, [2, 3, 4] would have been read one layer early."""
    target = build("deepseek_v3", num_hidden_layers=6)
    convert(str(target), tmp_path / "e3", to="eagle3", dtype="float32", aux_layers=aux)
    for fmt in ("sglang", "speculators"):
        export(tmp_path / "e3", fmt, tmp_path / fmt, config=ExportConfig(dtype="float32"))
    cfg = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == written
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in aux]
    assert load_draft(tmp_path / "speculators").aux_layer_ids == aux == load_draft(tmp_path / "e3").aux_layer_ids
    _check_aux_capture(tmp_path / "sglang", target, SGLANG_CAPTURES["deepseek_v2"])
    # the Llama encoding, re-introduced, is what SGLang would misread: the validator says so
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = aux
    (tmp_path / "sglang" / "config.json").write_text(json.dumps(cfg))
    assert (aux == written) == (validate(tmp_path / "sglang") == [])


def test_speculators_verifier_is_the_hub_id(eagle3: Path, tmp_path: Path) -> None:
    """vLLM loads `verifier.name_or_path` when serving a speculators draft directly: a conversion from a hub snapshot
    (what a hub SOURCE resolves to) names the repo id, not this machine's cache path; --verifier overrides."""
    from mtp2draft.formats.eagle3 import hub_id_of

    snapshot = tmp_path / "hub" / "models--zai-org--GLM-4.5-Air" / "snapshots" / "0123abcd"
    assert (
        hub_id_of(str(snapshot)) == "zai-org/GLM-4.5-Air" and hub_id_of("zai-org/GLM-4.5-Air") == "zai-org/GLM-4.5-Air"
    )
    assert hub_id_of(str(tmp_path / "my-target")) is None and hub_id_of("./GLM") is None
    draft = tmp_path / "draft"
    shutil.copytree(eagle3, draft)
    prov = json.loads((draft / "provenance.json").read_text())
    (draft / "provenance.json").write_text(json.dumps({**prov, "source": str(snapshot)}))
    export(draft, "speculators", tmp_path / "a")
    verifier = json.loads((tmp_path / "a" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == "zai-org/GLM-4.5-Air"
    export(draft, "speculators", tmp_path / "b", config=ExportConfig(verifier="me/my-target"))
    verifier = json.loads((tmp_path / "b" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == "me/my-target"


def test_deepseek_aux_ids_from_layer_0_are_refused_for_sglang(build, tmp_path: Path) -> None:
    """A 4-layer DeepSeek target's only aux ids are [0, 1, 2]: SGLang cannot be told to capture the output of layer 0
    (a first id of 1 is shifted to 2, a first id of 0 is the embedding): the sglang export refuses, the speculators
    export (vLLM) is fine."""
    target = build("deepseek_v3", num_hidden_layers=4)
    convert(str(target), tmp_path / "e3", to="eagle3", dtype="float32")
    assert load_draft(tmp_path / "e3").aux_layer_ids == [0, 1, 2]
    with pytest.raises(ValidationError, match="SGLang reads eagle_config"):
        export(tmp_path / "e3", "sglang", tmp_path / "sglang")
    assert not (tmp_path / "sglang").exists()
    export(tmp_path / "e3", "speculators", tmp_path / "spec")
    assert validate(tmp_path / "spec") == []


def test_convert_refuses_eagle3_on_a_target_too_shallow_for_three_aux_layers(build, tmp_path: Path, capsys) -> None:
    """A 3-layer target has two capturable layers (outputs of 0 and 1): convert used to write aux ids [0, 0, 1],
    which its own export then refused. It refuses at once, in one line, before writing anything."""
    from mtp2draft.errors import CheckpointError, ShallowTargetError

    target = build("mimo", num_hidden_layers=3)
    with pytest.raises(ShallowTargetError, match="at least 4 layers; this one has 3"):
        convert(str(target), tmp_path / "e3", to="eagle3")
    code, out, err = run_cli(capsys, "convert", str(target), "--to", "eagle3", "--out", str(tmp_path / "e3"))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == ShallowTargetError.exit_code and out == "" and len(errors) == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == errors[0] and "at least 4 layers" in errors[0]
    assert not (tmp_path / "e3").exists()
    with pytest.raises(CheckpointError, match=r"three distinct target layers in 0\.\.4, got \[1, 1, 2\]"):
        convert(str(build("mimo", num_hidden_layers=6)), tmp_path / "e3", to="eagle3", aux_layers=[1, 1, 2])
    convert(str(target), tmp_path / "mtp", to="mtp")  # the native draft needs no aux layers


# ---- native formats ------------------------------------------------------------------------------------------------
def test_nextn_export_renumbers_and_keeps_fp8(build, work: Path) -> None:
    target = build("deepseek_v3_fp8")
    convert(str(target), work / "ds8-mtp", to="mtp", dtype="float32")
    export(work / "ds8-mtp", "nextn", work / "ds8-nextn")
    export(work / "ds8-mtp", "nextn", work / "ds8-nextn-t", target=str(target))  # dtypes from the headers
    cfg = json.loads((work / "ds8-nextn" / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLMNextN"] and cfg["num_hidden_layers"] == 1
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["quantization_config"]["quant_method"] == "fp8"
    assert cfg["hidden_size"] == 64 and cfg["vocab_size"] == 256  # the target's other fields kept
    w = load_file(str(work / "ds8-nextn" / "model.safetensors"))
    assert all(k.startswith("model.layers.0.") for k in w)
    assert not [k for k in w if "embed_tokens" in k or "shared_head.head" in k or "lm_head" in k]
    assert w["model.layers.0.eh_proj.weight"].dtype == torch.bfloat16  # bf16 in the release: bf16 here
    assert w["model.layers.0.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    q = "model.layers.0.self_attn.q_b_proj.weight"
    assert w[q].dtype == torch.float8_e4m3fn and w[q + "_scale_inv"].dtype == torch.float32
    with_target = load_file(str(work / "ds8-nextn-t" / "model.safetensors"))
    assert w.keys() == with_target.keys() and all(torch.equal(w[k].float(), with_target[k].float()) for k in w)
    # the layer, dequantised, is the draft's within e4m3 rounding
    draft = load_file(str(work / "ds8-mtp" / "model.safetensors"))
    back = dequantize_fp8(w[q], w[q + "_scale_inv"])
    _assert_within_e4m3(back, draft["block.self_attn.q_b_proj.weight"], w[q + "_scale_inv"])
    assert validate(work / "ds8-nextn") == []


def test_nextn_of_a_family_matched_by_architecture_only_validates(build, work: Path) -> None:
    """Ling 3 (spec bailing_hybrid) is matched by architecture only: its model_type `bailing_hybrid` is also Ling
    2.5's, another MTP block. The NextN config keeps that model_type and names SGLang's BailingMoeForCausalLMNextN,
    so the validator finds the spec by that architecture (one spec names it) where the model_type matches none: by
    model_type alone, every Ling 3 nextn export failed its own validation."""
    convert(str(build("bailing_hybrid")), work / "ling-mtp", to="mtp", dtype="float32")
    export(work / "ling-mtp", "nextn", work / "ling-nextn")
    cfg = json.loads((work / "ling-nextn" / "config.json").read_text())
    assert cfg["model_type"] == "bailing_hybrid" and cfg["architectures"] == ["BailingMoeForCausalLMNextN"]
    assert cfg["num_hidden_layers"] == 1 and validate(work / "ling-nextn") == []
    w = load_file(str(work / "ling-nextn" / "model.safetensors"))
    cfg["num_hidden_layers"] = 2  # the layer is still checked against the spec's layout
    (work / "ling-nextn" / "config.json").write_text(json.dumps(cfg))
    assert any("num_hidden_layers is 2" in p for p in validate(work / "ling-nextn"))
    assert all(k.startswith("model.layers.0.") for k in w)
    # an architecture several specs name (Qwen3.5's MTP class) picks none: the model_type decides, as before
    cfg.update(model_type="no_such_type", architectures=["Qwen3_5ForCausalLMMTP"], num_hidden_layers=1)
    (work / "ling-nextn" / "config.json").write_text(json.dumps(cfg))
    assert any("matches no spec" in p for p in validate(work / "ling-nextn"))


def test_nextn_is_refused_for_a_family_without_nextn(build, work: Path, tmp_path: Path, capsys) -> None:
    convert(str(build("mimo")), tmp_path / "mimo-mtp", to="mtp")
    code, out, err = run_cli(
        capsys, "export", str(tmp_path / "mimo-mtp"), "--format", "nextn", "--out", str(tmp_path / "o")
    )
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().startswith("error:") and "has no [nextn] section" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def _per_element(scale_inv: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """Each element's block scale: [ceil(M/bm), ceil(N/bn)] -> [M, N] (the edge blocks ragged)."""
    return scale_inv.float().repeat_interleave(block[0], 0)[: shape[0]].repeat_interleave(block[1], 1)[:, : shape[1]]


def _assert_within_e4m3(
    got: torch.Tensor, want: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> None:
    s = _per_element(scale_inv, tuple(want.shape), block)
    bound = E4M3_REL * want.float().abs() + E4M3_SUBNORMAL * s
    assert bool(((got.float() - want.float()).abs() <= bound + 1e-12).all())


def _tensor_bytes(root: Path, weight_map: dict[str, str]) -> int:
    """Bytes of every tensor in the shards `weight_map` names, read from their safetensors headers (8-byte length,
    then JSON with each tensor's data_offsets), each tensor counted once and each one the map names present."""
    total, seen = 0, set()
    for file in sorted(set(weight_map.values())):
        with open(root / file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                total += info["data_offsets"][1] - info["data_offsets"][0]
                seen.add(name)
    assert seen == set(weight_map)
    return total


def _overlay(target: Path, stitched: Path, out: Path) -> Path:
    """What the README tells a user to do: a copy of the target with the overlay's shards and index on top."""
    shutil.copytree(target, out)
    files = json.loads((stitched / "provenance.json").read_text())["export"]["overlay_files"]
    for name in files:
        shutil.copyfile(stitched / name, out / name)
    return out


@pytest.mark.parametrize(
    "fixture", ["deepseek_v3", "glm4_moe", "hy_v4", "hy_v4_fused", "hy_v4_fused_bare", "qwen3_5_flat"]
)
def test_stitched_round_trip_bf16_is_exact(build, work: Path, fixture: str) -> None:
    """Every shard rewritten holds the target's keys (the layer in its own layout: HY-V4's experts fused or per
    expert as the target stores them) and dtypes; the layer read back from the overlay is the fine-tuned one."""
    target, draft = _perturbed_native(build, work, fixture, f"{fixture}-ft")
    export(draft, "stitched", work / f"{fixture}-st", target=str(target))
    st = work / f"{fixture}-st"
    assert validate(st) == []
    prov = json.loads((st / "provenance.json").read_text())["export"]
    assert sorted(p.name for p in st.iterdir()) == sorted(
        [*prov["overlay_files"], ".mtp2draft", "config.json", "README.md", "provenance.json"]
    )
    assert json.loads((st / "config.json").read_text()) == json.loads((target / "config.json").read_text())
    assert "--speculative-config" in (st / "README.md").read_text()
    # each rewritten shard keeps its other tensors bit for bit, and every tensor its dtype
    family = fixture.removesuffix("_bare").removesuffix("_fused")  # a layout of a family's release: the family's row
    mtp = next(f.mtp for f in FAMILIES if f.fixture == family)  # the prefix of the fixture's MTP tensors
    for shard in prov["overlay_files"][:-1]:
        with safe_open(str(st / shard), "pt") as new, safe_open(str(target / shard), "pt") as old:
            assert sorted(new.keys()) == sorted(old.keys())
            for key in new.keys():  # noqa: SIM118
                a, b = new.get_tensor(key), old.get_tensor(key)
                assert a.dtype == b.dtype, key
                if not key.startswith(mtp):  # every tensor outside the MTP layer is the target's, bit for bit
                    assert torch.equal(a, b), key
    overlay = _overlay(target, st, work / f"{fixture}-overlay")
    convert(str(overlay), work / f"{fixture}-back", to="mtp")
    back = load_file(str(work / f"{fixture}-back" / "model.safetensors"))
    fine = load_file(str(draft / "model.safetensors"))
    assert back.keys() == fine.keys()
    for key in fine:
        assert torch.equal(back[key], fine[key]), key  # bf16 -> bf16: exact


def _engine_dequantised(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """An FP8 weight as a block-FP8 engine reads it, written here apart from mtp2draft's reader: every [bm, bn] block
    of the e4m3 values times its `_scale_inv` entry (the edge blocks ragged)."""
    return q.float() * _per_element(scale_inv, tuple(q.shape), block)


@pytest.mark.parametrize("fixture", [name for name, row in FIXTURES.items() if row.get("fp8")])
def test_every_fp8_family_reads_back_its_stitched_draft_within_e4m3_rounding(build, work: Path, fixture: str) -> None:
    """For each family fixture that ships FP8 (DeepSeek's layout, MiMo-V2-Flash's, GLM-5's DSA): the stitched draft,
    laid over the target as a user would, read back as an engine loads it (e4m3 x block scale), equals the distilled
    weights within e4m3 rounding where it was requantised, and exactly elsewhere."""
    from mtp2draft.checkpoint.fp8 import fp8_block_size
    from mtp2draft.draft.disk import read_draft_config
    from mtp2draft.draft.layout import native_to_checkpoint
    from mtp2draft.family.spec import get_spec

    target, draft = _perturbed_native(build, work, fixture, f"{fixture}-ft8")
    st = work / f"{fixture}-st8"
    export(draft, "stitched", st, target=str(target))
    assert validate(st) == []
    ckpt = open_checkpoint(str(_overlay(target, st, work / f"{fixture}-overlay8")))
    orig = open_checkpoint(str(target))
    requantised = set(json.loads((st / "provenance.json").read_text())["export"]["requantised_fp8"])
    assert requantised and all(ckpt.info(k).dtype == "F8_E4M3" for k in requantised)
    spec, block = get_spec(read_draft_config(draft)["mtp2draft"]["spec"]), fp8_block_size(ckpt.config)
    fine = {k: v.float() for k, v in load_file(str(draft / "model.safetensors")).items()}
    seen = set()
    for module_key, value in fine.items():
        for key, want in native_to_checkpoint(spec, ckpt.config, 0, {module_key: value}).items():
            assert ckpt.info(key).dtype == orig.info(key).dtype, key  # FP8 stays FP8, bf16 bf16, fp32 fp32
            if key in requantised:
                raw = ckpt.read_raw([key, key + "_scale_inv"])
                got = _engine_dequantised(raw[key], raw[key + "_scale_inv"], block)
                _assert_within_e4m3(got, want, raw[key + "_scale_inv"], block)
                seen.add(key)
            else:
                stored = ckpt.read_raw([key])[key]
                assert torch.equal(stored.float(), want.to(stored.dtype).float()), key  # cast, not requantised
    assert seen == requantised
    if fixture == "deepseek_v3_fp8":  # DeepSeek ships eh_proj in bf16: requantising it would change the layer
        assert "model.layers.2.eh_proj.weight" in orig.keys_with_prefix("model.layers.2.")
        assert "model.layers.2.eh_proj.weight" not in requantised


# ---- quantised targets: DeepSeek-V4 as shipped, and ModelOpt / compressed-tensors re-releases --------------------------
_V4_EXPERT_SCALE = re.compile(r"\.experts\.\d+\.w[123]\.scale$")  # vLLM 0.34 nvidia/mtp.py _EXPERT_SCALE_RE
_V4_GLUE = ("embed_tokens", "enorm", "hnorm", "h_proj", "e_proj", "shared_head", "hc_head_fn", "hc_head_base",
            "hc_head_scale")  # fmt: skip
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def vllm_v4_mtp_reads(stored: dict[str, torch.Tensor], num_hidden_layers: int) -> dict[tuple[str, int | None], Any]:
    """The MTP tensors of a DeepSeek-V4 checkpoint as vLLM 0.34 loads and computes with them, written from its source
    (vllm/models/deepseek_v4/nvidia/mtp.py `DeepSeekV4MTP.load_weights`, `_to_spec_layer_name`,
    `_rewrite_spec_layer_name`; models/deepseek_v4/quant_config.py `DeepseekV4FP8Config`): `mtp.{i}.` becomes
    `model.layers.{num_hidden_layers + i}.` (`mtp_block.` inside the decoder block, glue names kept); `.norm.weight`
    is `shared_head.norm.weight`; a `.scale` is `weight_scale` for a routed expert (its e8m0 viewed as uint8, as the
    loader does) and `weight_scale_inv` otherwise; `gate.bias` is `e_score_correction_bias`; w1 / w3 and wq_a / wkv
    are shards of `gate_up_proj` / `fused_wqa_wkv`. The quant config then computes with block FP8 linears (e4m3 times
    the e8m0 `weight_scale_inv` of each 128 x 128 block, Fp8Config with is_scale_e8m0) and `Mxfp4MoEMethod` experts
    (e2m1 from the low nibble first, times 2^(weight_scale - 127) per 32 inputs). Each shard is dequantised as it is
    loaded (vLLM loads a shard's scales at the shard's block offset). Returns (parameter, shard) -> fp32 weight."""
    out: dict[tuple[str, int | None], Any] = {}
    scales = {k: v for k, v in stored.items() if k.endswith(".scale")}
    for key, tensor in stored.items():
        if not key.startswith("mtp.") or key.endswith(".scale"):
            continue
        name = f"model.layers.{num_hidden_layers + int(key.split('.')[1])}." + key.split(".", 2)[2]
        for old, new in ((".head.weight", ".shared_head.head.weight"), (".norm.weight", ".shared_head.norm.weight")):
            name = name.replace(old, new)
        if not any(g in name for g in _V4_GLUE):  # the decoder block's tensors
            layer = f"model.layers.{name.split('.')[2]}."
            name = name.replace(layer, layer + "mtp_block.")
        scale = scales.get(key.removesuffix("weight") + "scale")
        if scale is None:
            value = tensor.float()
        elif _V4_EXPERT_SCALE.search(key.removesuffix("weight") + "scale"):
            u8, exp = tensor.view(torch.uint8).long(), scale.view(torch.uint8).float()  # weight_scale as uint8
            value = torch.stack((_E2M1[u8 & 15], _E2M1[u8 >> 4]), -1).reshape(tensor.shape[0], -1)
            value = value * torch.exp2(exp - 127).repeat_interleave(32, 1)
        else:
            value = tensor.float() * _per_element(scale.float(), tuple(tensor.shape), (128, 128))  # weight_scale_inv
        name = name.replace(".ffn.gate.bias", ".ffn.gate.e_score_correction_bias")
        shard = None
        for param, ckpt, shard_id in (("gate_up_proj", "w1", 0), ("gate_up_proj", "w3", 1),
                                      ("attn.fused_wqa_wkv", "attn.wq_a", 0), ("attn.fused_wqa_wkv", "attn.wkv", 1)):  # fmt: skip
            if f".{ckpt}." in name and ".experts." not in name.replace(".shared_experts.", "."):
                name, shard = name.replace(ckpt, param), shard_id
                break
        name = name.replace(".shared_experts.w2", ".shared_experts.down_proj")
        out[(name, shard)] = value
    return out


def test_v4_stitched_is_written_in_the_release_quantisation_and_read_back_as_vllm_reads_it(build, work: Path) -> None:
    """The distilled DeepSeek-V4 layer stitched over the release-quantised target keeps the checkpoint's own names
    and quantisation (FP4 + e8m0 experts, FP8 + e8m0 linears, fp32 mixes / sinks / router bias, bf16 norms); read
    back as vLLM 0.34 loads it (`vllm_v4_mtp_reads`, written from its loader and quant config) it equals the
    distilled weights within e2m1 / e4m3 rounding, and exactly where the release keeps floats."""
    from mtp2draft.draft.disk import read_draft_config
    from mtp2draft.draft.layout import native_to_checkpoint
    from mtp2draft.family.spec import get_spec

    target, draft = _perturbed_native(build, work, "deepseek_v4_fp4", "v4-ft")
    st = work / "v4-st"
    export(draft, "stitched", st, target=str(target))
    assert validate(st) == []
    record = json.loads((st / "provenance.json").read_text())["export"]
    assert {k: len(v) for k, v in record["requantised"].items()} == {"fp4-e8m0": 24, "fp8-e8m0": 10}
    assert record["unquantised"] == [] and "config.json" not in record["overlay_files"]
    overlay = open_checkpoint(str(_overlay(target, st, work / "v4-overlay")))
    orig = open_checkpoint(str(target))
    layer = [k for k in orig.weight_map if k.startswith("mtp.")]
    assert sorted(k for k in overlay.weight_map if k.startswith("mtp.")) == sorted(layer)
    assert all(overlay.info(k).dtype == orig.info(k).dtype for k in layer)  # the release's dtype, key by key
    cfg = read_draft_config(draft)["mtp2draft"]
    spec, n = get_spec(cfg["spec"]), overlay.config["num_hidden_layers"]
    fine = {}
    for module_key, value in load_file(str(draft / "model.safetensors")).items():
        fine.update(native_to_checkpoint(spec, overlay.config, 0, {module_key: value.float()}))
    stored = {
        k: v for f in {overlay.weight_map[k] for k in layer} for k, v in load_file(str(work / "v4-overlay" / f)).items()
    }
    _assert_vllm_reads_the_distilled_layer(stored, fine, n)


def _assert_vllm_reads_the_distilled_layer(stored: dict, fine: dict, n: int) -> None:
    """`stored` (a V4 layer's tensors as written) read as vLLM 0.34 loads them (`vllm_v4_mtp_reads`) equals the
    distilled weights `fine` (checkpoint names) within e2m1 / e4m3 rounding, and exactly where the release keeps
    floats (cast to its dtype)."""
    reads = vllm_v4_mtp_reads(stored, n)
    by_key = {}
    for (name, shard), value in reads.items():
        by_key.setdefault(name, {})[shard] = value
    assert len(reads) == len(fine)  # every weight of the layer is one vLLM parameter (shard)
    assert set(by_key) >= {f"model.layers.{n}.hc_head_fn", f"model.layers.{n}.e_proj.weight",
                           f"model.layers.{n}.mtp_block.attn.fused_wqa_wkv.weight",
                           f"model.layers.{n}.shared_head.norm.weight"}  # fmt: skip
    for key, want in fine.items():
        scale = stored.get(key.removesuffix("weight") + "scale") if key.endswith("weight") else None
        got = _v4_read(reads, key, n)
        if scale is None:
            assert torch.equal(got, want.to(stored[key].dtype).float()), key  # cast to the release's float dtype
        elif stored[key].dtype == torch.int8:  # e2m1: within half a step, a step is at most 2 x the block scale
            step = scale.float().repeat_interleave(32, 1)
            assert bool(((got - want).abs() <= step + 1e-12).all()), key
        else:
            _assert_within_e4m3(got, want, scale.float())
    assert any(not torch.equal(_v4_read(reads, k, n), v) for k, v in fine.items() if stored[k].dtype == torch.int8)


def sglang_v4_nextn_loads(key: str, num_hidden_layers: int) -> str | None:
    """A key of a standalone DeepSeek-V4 NextN checkpoint as SGLang 0.5.23's `DeepseekV4ForCausalLMNextN` names the
    parameter it loads, None where it skips the tensor; written from its source (srt/models/deepseek_v4.py
    `remap_weight_name_to_dpsk_hf_format` with is_nextn, then `load_weights`' is_nextn branch: the NextN layer is
    `num_hidden_layers`, or 0 when num_hidden_layers is 1; embedding and head skipped; the glue tensors to `model.*`,
    the decoder's to `model.decoder.*`)."""
    nextn_layer = 0 if num_hidden_layers == 1 else num_hidden_layers
    name = key
    if name.startswith("mtp."):
        rest = name.split(".", 2)[2]
        if rest.startswith(("e_proj", "h_proj", "emb", "enorm", "hnorm", "norm", "head", "hc_head")):
            renames = {"norm.weight": "shared_head.norm.weight", "e_proj.scale": "e_proj.weight_scale_inv",
                       "h_proj.scale": "h_proj.weight_scale_inv"}  # fmt: skip
            rest = "shared_head.head.weight" if rest.startswith("head.") else renames.get(rest, rest)
        name = f"model.layers.{num_hidden_layers}." + rest
    name = "model." + name if name.startswith("layers.") else name
    for old, new in ((".attn.", ".self_attn."), (".ffn.", ".mlp."), (".attn_norm.", ".input_layernorm."),
                     (".ffn_norm.", ".post_attention_layernorm.")):  # fmt: skip
        name = name.replace(old, new)
    if ("self_attn" in name or "mlp" in name) and name.endswith(".scale"):
        name = name.removesuffix(".scale") + ".weight_scale_inv"
    name = name.replace(".gate.bias", ".gate.e_score_correction_bias")
    for old, new in ((".w1.", ".gate_proj."), (".w2.", ".down_proj."), (".w3.", ".up_proj.")):
        name = name.replace(old, new)
    prefix = f"model.layers.{nextn_layer}"
    if "shared_head.head" in name or "embed_tokens" in name or not name.startswith(prefix):
        return None
    glue = ("shared_head.norm", ".e_proj", "h_proj", "enorm", "hnorm", "hc_head_base", "hc_head_fn", "hc_head_scale")
    return name.replace(prefix, "model" if any(g in name for g in glue) else "model.decoder")


def test_v4_nextn_is_the_layer_in_the_release_quantisation_as_both_engines_load_it(build, work: Path) -> None:
    """`export --format nextn` of a DeepSeek-V4 draft: the layer under the release's own names (`mtp.0.*`) and
    quantisation (FP4 + e8m0 experts, FP8 + e8m0 linears), the target's config with num_hidden_layers kept and the
    NextN architecture. SGLang 0.5.23 (`sglang_v4_nextn_loads`, written from its loader) loads every tensor into the
    NextN model, where a renumbered one-layer checkpoint would have every tensor skipped; read as vLLM 0.34 loads it
    (`vllm_v4_mtp_reads`) it equals the distilled weights within the formats' rounding. Without --target, convert's
    provenance gives the same bytes."""
    from mtp2draft.draft.layout import native_to_checkpoint
    from mtp2draft.family.spec import get_spec

    target, draft = _perturbed_native(build, work, "deepseek_v4_fp4", "v4-ft")
    nx, nx_prov = work / "v4-nextn", work / "v4-nextn-prov"
    export(draft, "nextn", nx, target=str(target))
    export(draft, "nextn", nx_prov)
    assert validate(nx) == [] and validate(nx_prov) == []
    cfg, tcfg = (json.loads((d / "config.json").read_text()) for d in (nx, target))
    assert cfg == {**tcfg, "architectures": ["DeepseekV4ForCausalLMNextN"], "num_nextn_predict_layers": 1}
    record = json.loads((nx / "provenance.json").read_text())["export"]
    assert {k: len(v) for k, v in record["requantised"].items()} == {"fp4-e8m0": 24, "fp8-e8m0": 10}
    stored, orig = load_file(str(nx / "model.safetensors")), open_checkpoint(str(target))
    layer = [k for k in orig.weight_map if k.startswith("mtp.")]
    assert sorted(stored) == sorted(layer) and all(str(stored[k].dtype).endswith(
        {"F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "I8": "int8", "BF16": "bfloat16",
         "F32": "float32"}[orig.info(k).dtype]) for k in layer)  # fmt: skip
    prov = load_file(str(nx_prov / "model.safetensors"))
    assert prov.keys() == stored.keys() and all(torch.equal(prov[k].view(torch.uint8), stored[k].view(torch.uint8))
                                                for k in stored if stored[k].dim())  # fmt: skip
    n = cfg["num_hidden_layers"]
    sglang = {k: sglang_v4_nextn_loads(k, n) for k in stored}
    assert None not in sglang.values()
    assert sglang["mtp.0.e_proj.scale"] == "model.e_proj.weight_scale_inv"
    assert sglang["mtp.0.norm.weight"] == "model.shared_head.norm.weight"
    assert sglang["mtp.0.ffn.experts.1.w1.scale"] == "model.decoder.mlp.experts.1.gate_proj.weight_scale_inv"
    assert all(sglang_v4_nextn_loads(k, 1) is None for k in stored)  # why num_hidden_layers is not set to 1
    spec, fine = get_spec("deepseek_v4"), {}
    for module_key, value in load_file(str(draft / "model.safetensors")).items():
        fine.update(native_to_checkpoint(spec, tcfg, 0, {module_key: value.float()}))
    _assert_vllm_reads_the_distilled_layer(stored, fine, n)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"mtp.0.ffn.experts.1.w1.scale": "nan"}, "mtp.0.ffn.experts.1.w1.weight holds non-finite values"),
        ({"mtp.0.e_proj.scale": "double"}, "mtp.0.e_proj.scale has shape [2, 1], expected [1, 1]"),
        ({"mtp.0.hc_head_scale": None}, "mtp.0.hc_head_scale is missing"),
        ({"mtp.0.ffn.experts.2.w3.scale": None}, "mtp.0.ffn.experts.2.w3.weight"),
    ],
)
def test_v4_nextn_with_a_tampered_scale_or_a_missing_stream_tensor_is_one_error_line(
    build, work: Path, tmp_path: Path, capsys, edit: dict, needle: str
) -> None:
    target, draft = _perturbed_native(build, work, "deepseek_v4_fp4", "v4-ft")
    nx = tmp_path / "nx"
    export(draft, "nextn", nx, target=str(target))
    clean = load_file(str(nx / "model.safetensors"))
    tensors = {k: v for k, v in clean.items() if edit.get(k, "") is not None}
    for key, how in edit.items():
        if how == "nan":
            tensors[key] = torch.full_like(clean[key].view(torch.uint8), 255).view(clean[key].dtype)
        elif how == "double":
            tensors[key] = torch.cat([clean[key], clean[key]])
    save_file(tensors, str(nx / "model.safetensors"), {"format": "pt"})
    code, out, err = run_cli(capsys, "validate", str(nx))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in err
    assert needle in out, out


def test_validate_reads_a_v4_overlay_as_its_scales_say(build, work: Path, tmp_path: Path) -> None:
    """`validate` dequantises each FP4 / FP8 weight of a V4 overlay by its e8m0 scales: a tampered scale (NaN byte,
    wrong shape) or a missing stream tensor is a violation naming it."""
    target, draft = _perturbed_native(build, work, "deepseek_v4_fp4", "v4-ft")
    st = tmp_path / "st"
    export(draft, "stitched", st, target=str(target))
    index = json.loads((st / "model.safetensors.index.json").read_text())
    shard = st / index["weight_map"]["mtp.0.ffn.experts.1.w1.scale"]
    clean = load_file(str(shard))
    from safetensors import safe_open

    with safe_open(str(shard), "pt") as f:
        meta = f.metadata()  # the stitched export's mark kept: the edits stand for tampering with the overlay
    for edit, needle in (
        ({"mtp.0.ffn.experts.1.w1.scale": lambda t: torch.full_like(t.view(torch.uint8), 255).view(t.dtype)},
         "mtp.0.ffn.experts.1.w1.weight holds non-finite values"),
        ({"mtp.0.e_proj.scale": lambda t: torch.cat([t, t])}, "mtp.0.e_proj.scale has shape [2, 1], expected [1, 1]"),
        ({"mtp.0.hc_head_scale": None}, "mtp.0.hc_head_scale"),
    ):  # fmt: skip
        tensors = dict(clean)
        for key, fn in edit.items():
            tensors = {k: v for k, v in tensors.items() if k != key} if fn is None else {**tensors, key: fn(clean[key])}
        save_file(tensors, str(shard), meta)
        problems = validate(st)
        assert problems and any(needle in p for p in problems), (needle, problems)
    save_file(clean, str(shard), meta)
    assert validate(st) == []


def _v4_read(reads: dict, key: str, n: int) -> torch.Tensor:
    """The value vLLM holds for release key `key` (mtp.0 only), from `vllm_v4_mtp_reads`."""
    for (name, shard), value in reads.items():
        back = name.replace(f"model.layers.{n}.mtp_block.", "mtp.0.").replace(f"model.layers.{n}.", "mtp.0.")
        back = back.replace("shared_head.norm", "norm").replace("e_score_correction_bias", "bias")
        back = back.replace("shared_experts.down_proj", "shared_experts.w2")
        if shard is not None:
            back = back.replace("attn.fused_wqa_wkv", ("attn.wq_a", "attn.wkv")[shard])
            back = back.replace("gate_up_proj", ("w1", "w3")[shard])
        if back == key:
            return value
    raise AssertionError(f"vLLM loads no parameter from {key}")


def _vllm_excludes(qconfig: dict, module: str) -> bool:
    """Whether vLLM 0.34 builds `module` unquantised under this quantization_config: ModelOpt's `is_layer_excluded`
    (the `ignore` / `exclude_modules` list: exact, substring, or `fnmatch` wildcard), compressed-tensors'
    `should_ignore_layer` (`ignore`: exact, or `re:` patterns with `re.match`)."""
    from fnmatch import fnmatch

    if qconfig["quant_method"] == "modelopt":
        inner = qconfig.get("quantization") or qconfig
        patterns = inner.get("ignore", inner.get("exclude_modules", []))
        return any(module == p or (p != module and p in module) or fnmatch(module, p) for p in patterns)
    return any(re.match(p[3:], module) if p.startswith("re:") else p == module for p in qconfig.get("ignore", []))


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "int4"])
def test_stitched_over_a_quantised_release_writes_the_layer_unquantised_and_excluded(work: Path, scheme: str) -> None:
    """ModelOpt NVFP4 and compressed-tensors MXFP4 / int4 re-releases of the bundled target: the layer is written in
    bf16 under its logical keys, its quantised parts dropped from the shard and the index, and its prefix added to
    the config's exclusion list, which vLLM 0.34 honours for linears and for the routed experts alike:

    model_executor/layers/quantization/modelopt.py, ModelOptQuantConfigBase.get_quant_method:
        if self.is_layer_excluded(prefix):
            if isinstance(layer, (LinearBase, ParallelLMHead)):
                return UnquantizedLinearMethod()
            return None
    model_executor/layers/fused_moe/routed_experts.py, RoutedExperts._get_quant_method:
        if quant_method is None:
            quant_method = UnquantizedFusedMoEMethod(moe_config)
    model_executor/layers/quantization/compressed_tensors/compressed_tensors.py, get_scheme_dict:
        if should_ignore_layer(layer_name, ignore=self.ignore, fused_mapping=self.packed_modules_mapping):
            return None
    (get_quant_method then returns UnquantizedLinearMethod for a linear with no scheme, and
    compressed_tensors_moe.py get_moe_method: `if scheme_dict is None:  # ignored layer` ->
    `return UnquantizedFusedMoEMethod(layer.moe_config)`).

    bf16 rather than block FP8: an excluded layer is loaded by those unquantised methods, which take float weights.
    Read back by convert, the overlay gives the distilled layer exactly; the trunk's quantised tensors are the
    release's, byte for byte."""
    from support.quantised import requantise

    from mtp2draft.draft.disk import read_draft_config
    from mtp2draft.family.spec import get_spec
    from mtp2draft.pipeline import BUNDLED_TARGET

    release = requantise(BUNDLED_TARGET, work / f"{scheme}-release", scheme)
    draft = work / f"{scheme}-ft"
    convert(str(release), draft, to="mtp")
    w = perturb_draft(draft, seed=2)
    st = work / f"{scheme}-st"
    export(draft, "stitched", st, target=str(release))
    assert validate(st) == []
    record = json.loads((st / "provenance.json").read_text())["export"]
    orig = open_checkpoint(str(release))
    spec = get_spec(read_draft_config(draft)["mtp2draft"]["spec"])
    prefix = spec.key(spec.keys.block, orig.config, 0)
    quantised = sorted(k for k in orig.keys_with_prefix(prefix) if orig.quantised(k))
    assert quantised and record["unquantised"] == quantised and record["requantised"] == {}
    assert "UnquantizedFusedMoEMethod" in record["unquantised_why"] and "config.json" in record["overlay_files"]
    assert "written in bfloat16" in (st / "README.md").read_text()
    overlay = open_checkpoint(str(_overlay(release, st, work / f"{scheme}-overlay")))
    # the layer's bytes changed (bf16 in place of packed data and scales): the index's total_size follows them
    index = json.loads((work / f"{scheme}-overlay" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == _tensor_bytes(work / f"{scheme}-overlay", index["weight_map"])
    qconfig = overlay.config["quantization_config"]
    layer_modules = {k.rsplit(".", 1)[0] for k in quantised}
    assert all(_vllm_excludes(qconfig, m) for m in layer_modules)
    trunk = {k.rsplit(".", 1)[0] for k in orig.quant.weights if not k.startswith(prefix)}
    assert trunk and not any(_vllm_excludes(qconfig, m) for m in trunk)  # the trunk stays quantised
    assert not any(_vllm_excludes(orig.config["quantization_config"], m) for m in layer_modules)  # it was not before
    for key in quantised:  # one bf16 tensor under the logical key, no part left in the index or the shard
        assert overlay.info(key).dtype == "BF16" and not overlay.quantised(key)
        parts = set(orig.quant.weights[key].names.values()) - {key}
        assert not parts & set(overlay.weight_map) and not parts & set(overlay.header(overlay.weight_map[key]))
    for key in orig.quant.weights:
        if not key.startswith(prefix):
            names = orig.quant.weights[key].names.values()
            assert all(torch.equal(overlay.read_raw([n])[n], orig.read_raw([n])[n]) for n in names), key
    convert(str(work / f"{scheme}-overlay"), work / f"{scheme}-back", to="mtp")
    back = load_file(str(work / f"{scheme}-back" / "model.safetensors"))
    assert back.keys() == w.keys()
    for key, want in w.items():
        assert back[key].dtype in (torch.bfloat16, torch.float32)  # bf16, the router's fp32 bias as stored
        assert torch.equal(back[key], want.to(back[key].dtype)), key


def test_stitched_never_rewrites_a_tensor_shared_with_the_trunk(build, work: Path, tmp_path: Path) -> None:
    """ERNIE's MTP final norm is the trunk's `model.norm`: a draft that kept it stitches without touching it; one
    that changed it is refused (writing it back would change the target)."""
    target, draft = _perturbed_native(build, work, "ernie4_5_moe", "ernie-ft")
    with pytest.raises(DraftError, match="shares with the trunk"):
        export(draft, "stitched", tmp_path / "no", target=str(target))
    kept = _mutate(draft, tmp_path / "kept", weights=lambda w: w.update(
        {"final_norm.weight": load_file(str(work / "ernie-ft-src.safetensors"))["final_norm.weight"]}
    ))  # fmt: skip
    export(kept, "stitched", tmp_path / "st", target=str(target))
    assert validate(tmp_path / "st") == []
    overlay = _overlay(target, tmp_path / "st", tmp_path / "overlay")
    norm = open_checkpoint(str(target)).read_raw(["model.norm.weight"])["model.norm.weight"]
    assert torch.equal(open_checkpoint(str(overlay)).read_raw(["model.norm.weight"])["model.norm.weight"], norm)


def test_stitched_needs_a_target_and_the_right_one(build, work: Path, tmp_path: Path, capsys) -> None:
    _, draft = _perturbed_native(build, work, "deepseek_v3", "deepseek_v3-ft")
    code, out, err = run_cli(capsys, "export", str(draft), "--format", "stitched", "--out", str(tmp_path / "o"))
    assert code == 2 and "needs --target" in err and not (tmp_path / "o").exists()
    with pytest.raises(DraftError, match="is a glm4_moe checkpoint"):
        export(draft, "stitched", tmp_path / "o", target=str(build("glm4_moe")))
    with pytest.raises(DraftError, match="takes an EAGLE-3 draft"):
        export(draft, "sglang", tmp_path / "o")


@pytest.mark.hub
def test_stitched_from_a_hub_target_reads_only_the_mtp_shard(build, hub, work: Path, tmp_path: Path) -> None:
    target, draft = _perturbed_native(build, work, "deepseek_v3", "deepseek_v3-ft")
    hub.add_repo("org/ds", target)
    hub.reset_counters()
    export(draft, "stitched", tmp_path / "st", target="org/ds")
    prov = json.loads((tmp_path / "st" / "provenance.json").read_text())["export"]
    assert prov["target"] == "org/ds" and len(prov["target_commit"]) == 40
    assert validate(tmp_path / "st") == []
    untouched = set(json.loads((target / "model.safetensors.index.json").read_text())["weight_map"].values())
    untouched -= set(prov["overlay_files"])
    assert all(hub.bytes_served_for(f) < 4096 for f in untouched)  # at most a header of the others


# ---- the validator ------------------------------------------------------------------------------------------------
def _mutate(
    src: Path,
    dst: Path,
    config: Callable[[dict], object] | None = None,
    weights: Callable[[dict], object] | None = None,
) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if weights is not None:
        w = load_file(str(dst / "model.safetensors"))
        weights(w)
        save_file(w, str(dst / "model.safetensors"))
    return dst


def _set(w: dict, key: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    w[key] = fn(w[key].clone()).contiguous()


def _poke(t: torch.Tensor, value: float) -> torch.Tensor:
    t.view(-1)[0] = value
    return t


def _flip(t: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    t[int(d2t[0])] = False
    return t


SGLANG_BROKEN = {
    "missing d2t": (None, lambda w: w.pop("d2t"), "d2t is missing"),
    "t2d size": (None, lambda w: _set(w, "t2d", lambda t: t[:-1]), "t2d has shape [255]"),
    "d2t beyond vocab": (None, lambda w: _set(w, "d2t", lambda t: _poke(t.flip(0), 10**6).flip(0)), "outside"),
    "d2t negative": (None, lambda w: _set(w, "d2t", lambda t: _poke(t, -1)), "outside the target vocabulary"),
    "d2t vs t2d": (None, lambda w: _set(w, "t2d", lambda t: _flip(t, w["d2t"])), "t2d disagrees with d2t"),
    "q_proj width H": (
        None,
        lambda w: _set(w, "midlayer.self_attn.q_proj.weight", lambda t: t[:, :64]),
        "q_proj.weight reads H=64 inputs",
    ),
    "fc width": (None, lambda w: _set(w, "fc.weight", lambda t: t[:, :128]), "fc.weight is [64, 128]"),
    "aux ids missing in eagle_config": (
        lambda c: c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"),
        None,
        "eagle_config.eagle_aux_hidden_state_layer_ids is missing",
    ),
    "aux ids missing at top level": (
        lambda c: c.pop("eagle_aux_hidden_state_layer_ids"),
        None,
        "top-level eagle_aux_hidden_state_layer_ids is missing",
    ),
    "aux ids inconsistent": (
        lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [1, 2, 4]),
        None,
        "aux ids disagree",
    ),
    "aux ids repeated": (
        lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 1, 4]}),
        None,
        "three distinct ids",
    ),
    "NaN weight": (
        None,
        lambda w: _set(w, "norm.weight", lambda t: _poke(t, math.nan)),
        "norm.weight holds non-finite values (1 NaN",
    ),
    "Inf weight": (None, lambda w: _set(w, "lm_head.weight", lambda t: _poke(t, math.inf)), "(0 NaN, 1 Inf"),
    "d2t dtype": (None, lambda w: _set(w, "d2t", lambda t: t.to(torch.int32)), "d2t is int32"),
    "weight dtype": (None, lambda w: _set(w, "lm_head.weight", lambda t: t.half()), "lm_head.weight is float16"),
    "embed present": (
        None,
        lambda w: w.__setitem__("embed_tokens.weight", torch.zeros(256, 64, dtype=torch.bfloat16)),
        "embed_tokens.weight is present",
    ),
    "missing lm_head": (None, lambda w: w.pop("lm_head.weight"), "lm_head.weight is missing"),
    "missing norm": (None, lambda w: w.pop("norm.weight"), "norm.weight is missing"),
    "missing fc": (None, lambda w: w.pop("fc.weight"), "fc.weight is missing"),
    "tied head": (lambda c: c.__setitem__("tie_word_embeddings", True), None, "tie_word_embeddings is true"),
    "no draft_vocab_size": (lambda c: c.pop("draft_vocab_size"), None, "draft_vocab_size is missing"),
    "llama field missing": (lambda c: c.pop("rms_norm_eps"), None, "rms_norm_eps is missing"),
    "heads do not divide hidden": (
        lambda c: c.update(num_attention_heads=c["num_attention_heads"] * 3),
        None,
        "is not a multiple of num_attention_heads",
    ),
}


@pytest.mark.parametrize("case", list(SGLANG_BROKEN))
def test_validator_catches_broken_sglang_drafts(sglang_dir: Path, tmp_path: Path, case: str) -> None:
    config, weights, needle = SGLANG_BROKEN[case]
    broken = _mutate(sglang_dir, tmp_path / "broken", config, weights)
    assert any(needle in p for p in _problems(broken)), _problems(broken)


def _problems(path: Path) -> list[str]:
    """validate's violations, or the one line of a config field of the wrong form (`draft_config`), which validate
    refuses before the format's contract is checked."""
    try:
        return validate(path)
    except DraftError as exc:
        return [str(exc)]


SPECULATORS_BROKEN = {
    **{f"no {key}": (lambda c, key=key: c.pop(key), None, f"{key} is not written explicitly") for key in NORM_SWITCHES},
    "norm_before_residual true": (
        lambda c: c.__setitem__("norm_before_residual", True),
        None,
        "norm_before_residual is True",
    ),
    "aux ids missing": (lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), None, "ids is missing"),
    "aux ids in output-of terms": (
        lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 2, 4]),
        None,
        "ids >= 1",
    ),
    "SGLang weight names": (
        None,
        lambda w: w.update({k.replace("layers.0.", "midlayer."): w.pop(k) for k in list(w) if "layers.0." in k}),
        "(the SGLang name)",
    ),
    "no transformer_layer_config": (lambda c: c.pop("transformer_layer_config"), None, "transformer_layer_config"),
    "no proposal method": (
        lambda c: c["speculators_config"].__setitem__("proposal_methods", []),
        None,
        "proposal_methods is missing or empty",
    ),
    "q_proj width H": (
        None,
        lambda w: _set(w, "layers.0.self_attn.q_proj.weight", lambda t: t[:, :64]),
        "reads H=64 inputs",
    ),
    "missing t2d": (None, lambda w: w.pop("t2d"), "t2d is missing"),
}


@pytest.mark.parametrize("case", list(SPECULATORS_BROKEN))
def test_validator_catches_broken_speculators_drafts(speculators_dir: Path, tmp_path: Path, case: str) -> None:
    config, weights, needle = SPECULATORS_BROKEN[case]
    broken = _mutate(speculators_dir, tmp_path / "broken", config, weights)
    assert any(needle in p for p in _problems(broken)), _problems(broken)


@pytest.fixture(scope="module")
def nextn_dir(build, work: Path) -> Path:
    convert(str(build("deepseek_v3_fp8")), work / "nx-src", to="mtp")
    export(work / "nx-src", "nextn", work / "nx")
    return work / "nx"


NEXTN_BROKEN = {
    "embed kept": (
        None,
        lambda w: w.__setitem__("model.layers.0.embed_tokens.weight", torch.zeros(256, 64, dtype=torch.bfloat16)),
        "model.layers.0.embed_tokens.weight is present",
    ),
    "head kept": (
        None,
        lambda w: w.__setitem__("model.layers.0.shared_head.head.weight", torch.zeros(256, 64, dtype=torch.bfloat16)),
        "model.layers.0.shared_head.head.weight is present",
    ),
    "two layers": (lambda c: c.__setitem__("num_hidden_layers", 2), None, "num_hidden_layers is 2"),
    "not renumbered": (
        None,
        lambda w: w.update({k.replace("layers.0.", "layers.2."): w.pop(k) for k in list(w)}),
        "model.layers.0.eh_proj.weight is missing",
    ),
    "fp8 config over bf16 weights": (
        None,
        lambda w: w.update({k: w.pop(k).float().bfloat16() for k in list(w) if w[k].dtype == torch.float8_e4m3fn}),
        "quantization_config says fp8 but no tensor is FP8",
    ),
    "FP8 without scale": (
        None,
        lambda w: w.pop("model.layers.0.self_attn.q_b_proj.weight_scale_inv"),
        "q_b_proj.weight_scale_inv is missing",
    ),
}


@pytest.mark.parametrize("case", list(NEXTN_BROKEN))
def test_validator_catches_broken_nextn_exports(nextn_dir: Path, tmp_path: Path, case: str) -> None:
    config, weights, needle = NEXTN_BROKEN[case]
    problems = validate(_mutate(nextn_dir, tmp_path / "broken", config, weights))
    assert any(needle in p for p in problems), problems


def test_validator_catches_a_stitched_index_pointing_at_missing_files(build, work: Path, tmp_path: Path) -> None:
    target, draft = _perturbed_native(build, work, "deepseek_v3", "deepseek_v3-ft")
    export(draft, "stitched", tmp_path / "st", target=str(target))
    shard = json.loads((tmp_path / "st" / "provenance.json").read_text())["export"]["overlay_files"][0]
    (tmp_path / "st" / shard).unlink()
    problems = validate(tmp_path / "st")
    assert any(f"to {shard}, which is missing from the overlay" in p for p in problems), problems
    index = json.loads((tmp_path / "st" / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.2.eh_proj.weight"] = "model-00009-of-00009.safetensors"
    (tmp_path / "st" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("model-00009-of-00009.safetensors, which is missing" in p for p in validate(tmp_path / "st"))


def test_validator_lists_every_violation_at_once(sglang_dir: Path, tmp_path: Path) -> None:
    def config(c: dict) -> None:
        c.pop("eagle_aux_hidden_state_layer_ids")
        c["tie_word_embeddings"] = True

    def weights(w: dict) -> None:
        w.pop("d2t")
        w.pop("norm.weight")
        _set(w, "lm_head.weight", lambda t: _poke(t, math.nan))

    problems = validate(_mutate(sglang_dir, tmp_path / "b", config, weights))
    for needle in ("top-level", "tie_word_embeddings", "d2t is missing", "norm.weight is missing", "NaN"):
        assert any(needle in p for p in problems), (needle, problems)


def test_export_refuses_a_broken_draft_and_writes_nothing(eagle3: Path, tmp_path: Path) -> None:
    broken = _mutate(eagle3, tmp_path / "nan", weights=lambda w: _set(w, "fc.weight", lambda t: _poke(t, math.nan)))
    with pytest.raises(TensorError, match=r"nan/model.safetensors: fc.weight holds non-finite values \(1 NaN"):
        export(broken, "sglang", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("format", ["sglang", "speculators"])
def test_full_vocabulary_exports_carry_no_vocab_maps(eagle3: Path, work: Path, tmp_path: Path, format: str) -> None:
    """vLLM 0.32 refuses a full-vocabulary EAGLE-3 draft holding d2t ('no module or parameter named
    draft_id_to_target_id'): exports leave both maps out, load back with identity maps, and validate flags them."""
    raw = work / "eagle3-raw"  # convert's output: the target's whole vocabulary
    assert "d2t" not in load_file(str(raw / "model.safetensors"))
    out = tmp_path / format
    export(raw, format, out, config=ExportConfig(dtype="float32"))
    w = load_file(str(out / "model.safetensors"))
    assert not {"d2t", "t2d"} & set(w) and "lm_head.weight" in w
    assert validate(out) == []
    draft = load_draft(out)
    assert draft.draft_vocab_size == draft.vocab_size
    assert torch.equal(draft.to_target_ids(torch.arange(draft.vocab_size)), torch.arange(draft.vocab_size))
    v = draft.vocab_size
    broken = _mutate(out, tmp_path / "broken", None, lambda w: w.update(d2t=torch.zeros(v, dtype=torch.int64)))
    problems = validate(broken)
    assert any("d2t is present but draft_vocab_size equals vocab_size" in p for p in problems), problems
