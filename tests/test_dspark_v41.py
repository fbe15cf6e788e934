"""DeepSeek-V4.1's DSpark drafter read exactly: `inspect` and `convert` on a tiny checkpoint in V4.1's layout
(tests/support/dspark_v41.py: the names vLLM 0.32's loaders read, settings under `text_config`, FP8 in 32 x 32 blocks
with e8m0 scales, FP4 experts, the stages' own `dspark_n_routed_experts`, Engram tables and a vision tower in the
trunk). The values are checked against the shipped tensors dequantised here from the formats' definitions, and over
the loopback Hub `convert` fetches the drafter's bytes only: never the Engram tables or the trunk.

How V4.1 names its head stack differs from V4-0731 (`markov_head.embed` / `head`, no `hc_head`); both are data
(model_specs/dspark/), and `mtp2draft specs` lists them with the speculators format.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support import hub_keys
from support.fixtures import FIXTURES

from mtp2draft.cli.app import main
from mtp2draft.family.dspark import layouts

FIXTURE = "deepseek_v41_dspark"
TEXT = FIXTURES[FIXTURE]["config"]["text_config"]
ENGRAM = "layers.1.engram."  # trunk layer 1 is the Engram layer (engram_layer_ids)


def _weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def _shipped(path: Path, prefix: str = "mtp.") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(_weight_map(path).values())):
        out.update({k: v for k, v in load_file(path / shard).items() if k.startswith(prefix)})
    return out


def _stored(path: Path) -> dict[str, int]:
    """mtp.* name -> stored bytes, from the shards' safetensors headers (8-byte length, then JSON)."""
    out = {}
    for shard in sorted(set(_weight_map(path).values())):
        raw = (path / shard).read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        out.update({k: m["data_offsets"][1] - m["data_offsets"][0] for k, m in header.items() if k.startswith("mtp.")})
    return out


def _dequantised(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The shipped tensors in float32 by the formats' definitions, written here without mtp2draft: an e8m0 byte b is
    2^(b - 127); FP8 e4m3 [N, K] times its scale per 32 x 32 block, scale [ceil(N/32), ceil(K/32)] (vLLM 0.32's
    MXFP8 loader repeats each scale row over 32 weight rows); FP4 int8 [N, K/2], element 2i in the low nibble, times
    its scale per 32 inputs [N, K/32]."""
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    out = {}
    for key, t in raw.items():
        if key.endswith(".scale"):
            continue
        stored = raw.get(key.removesuffix(".weight") + ".scale")
        if stored is None:
            out[key] = t.float()
            continue
        scale = torch.exp2(stored.view(torch.uint8).double() - 127).float()
        if t.dtype == torch.int8:
            u8 = t.view(torch.uint8).long()
            values = torch.stack([e2m1[u8 & 0xF], e2m1[u8 >> 4]], dim=-1).flatten(-2)
            out[key] = values * scale.repeat_interleave(32, dim=1)
        else:
            grid = scale.repeat_interleave(32, 0).repeat_interleave(32, 1)[: t.shape[0], : t.shape[1]]
            out[key] = t.float() * grid
    return out


def test_fixture_has_the_v41_loader_names_and_the_drafter_own_experts(build) -> None:
    path = build(FIXTURE)
    names = hub_keys.load(FIXTURE)
    keys = list(_weight_map(path))
    ours = [k for k in keys if k.startswith("mtp.")]
    assert hub_keys.patterns(ours, "") == set(names["mtp_key_patterns"])
    engram = [hub_keys.pattern(k, "layers.1.").replace("{n}", "layers.{n}") for k in keys if k.startswith(ENGRAM)]
    assert set(engram) == set(names["engram_key_patterns"])
    # the stages hold dspark_n_routed_experts, the trunk n_routed_experts: two different counts
    assert hub_keys.experts(ours) == set(range(TEXT["dspark_n_routed_experts"]))
    assert hub_keys.experts(k for k in keys if k.startswith("layers.0.")) == set(range(TEXT["n_routed_experts"]))
    assert TEXT["dspark_n_routed_experts"] != TEXT["n_routed_experts"]
    # V4.1 has no hc_head (trunk or stage) and names its Markov factors embed / head
    assert not [k for k in keys if "hc_head" in k or "markov_w" in k]
    config = json.loads((path / "config.json").read_text())
    release = names["config"]
    assert (
        config["model_type"] == release["model_type"]
        and config["quantization_config"] == release["quantization_config"]
    )
    assert {k for k in release["text_config"] if k.startswith("dspark_")} <= set(config["text_config"])
    assert not [k for k in config if k.startswith("dspark_")]  # only under text_config
    # the scales are e8m0 over 32 x 32 blocks, ragged at the edge (attn.wkv has head_dim = 48 rows)
    raw = _shipped(path)
    assert raw["mtp.0.attn.wkv.scale"].dtype == torch.float8_e8m0fnu
    assert raw["mtp.0.attn.wkv.scale"].shape == (2, TEXT["hidden_size"] // 32)
    assert len(set(raw["mtp.0.main_proj.scale"].view(torch.uint8).flatten().tolist())) > 1  # not all one scale


def _inspect(capsys, source: str) -> dict[str, Any]:
    assert main(["inspect", source, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_reads_the_v41_drafter_from_text_config(build, capsys) -> None:
    path = build(FIXTURE)
    info = _inspect(capsys, str(path))
    stored = _stored(path)
    assert info["draft_kind"] == "dspark" and info["layout"] == "deepseek_v41" and info["num_stages"] == 3
    d = info["dspark"]
    assert d["found_in"] == "config.json text_config" and d["block_size"] == TEXT["dspark_block_size"]
    assert d["target_layer_ids"] == TEXT["dspark_target_layer_ids"] and d["markov_rank"] == TEXT["dspark_markov_rank"]
    assert d["experts_per_stage"] == d["n_routed_experts"] == TEXT["dspark_n_routed_experts"]
    for row in info["stages"]:
        mine = {k: b for k, b in stored.items() if k.startswith(f"mtp.{row['stage']}.")}
        assert row["tensors"] == len(mine) and row["bytes"] == sum(mine.values())
        assert row["routed_experts"] == TEXT["dspark_n_routed_experts"]
        assert row["quantised_weights"]["fp4-e8m0"] == 3 * TEXT["dspark_n_routed_experts"]
    assert info["drafter_bytes"] == sum(stored.values())
    heads = {t["name"]: t for t in info["head_tensors"]}
    h, rank = TEXT["hidden_size"], TEXT["dspark_markov_rank"]
    assert set(heads) == {
        "mtp.0.main_proj.weight",
        "mtp.0.main_norm.weight",
        "mtp.2.norm.weight",
        "mtp.2.markov_head.embed.weight",
        "mtp.2.markov_head.head.weight",
        "mtp.2.confidence_head.proj.weight",
    }
    assert heads["mtp.0.main_proj.weight"]["shape"] == [h, 3 * h] and heads["mtp.0.main_proj.weight"]["dtype"] == (
        "F8_E4M3"
    )
    assert heads["mtp.2.markov_head.embed.weight"]["shape"] == [TEXT["vocab_size"], rank]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "layout        deepseek_v41" in text and "experts       3 routed per stage, 1 per token" in text


def test_convert_writes_the_v41_stages_equal_to_the_shipped_tensors_dequantised(build, tmp_path: Path, capsys) -> None:
    path = build(FIXTURE)
    out = tmp_path / "dspark"
    assert main(["convert", str(path), "--out", str(out), "--dtype", "float32"]) == 0
    assert "wrote dspark draft" in capsys.readouterr().out
    got, want = load_file(out / "model.safetensors"), _dequantised(_shipped(path))
    assert set(got) == set(want) and len({k.split(".")[1] for k in got}) == 3
    for key in want:
        assert torch.equal(got[key], want[key]), key
    config = json.loads((out / "config.json").read_text())
    assert config["layout"] == "deepseek_v41" and config["num_stages"] == 3 and config["experts_per_stage"] == 3
    assert config["target_config"]["text_config"]["dspark_n_routed_experts"] == 3
    provenance = json.loads((out / "provenance.json").read_text())
    assert "mtp.0.main_proj.weight" in provenance["dequantised"]["fp8-e8m0"]
    assert len(provenance["dequantised"]["fp4-e8m0"]) == 3 * 3 * TEXT["dspark_n_routed_experts"]


def _copy(build, tmp_path: Path, name: str, edit) -> Path:
    path = Path(shutil.copytree(build(name), tmp_path / name))  # a copy: the built fixture is shared
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_inspect_refuses_a_stage_expert_count_the_config_does_not_give(build, tmp_path: Path, capsys) -> None:
    """V4.1's loader builds each stage with dspark_n_routed_experts experts: tensors holding another count are not
    the drafter the config declares (here the trunk's count, as a reader ignoring the key would expect)."""
    path = _copy(build, tmp_path, FIXTURE, lambda c: c["text_config"].update(dspark_n_routed_experts=6))
    line = _error(capsys, ["inspect", str(path)])
    assert "mtp.0.ffn.experts.* holds 3 routed experts (ids 0..2), but config.json says 6" in line
    assert "dspark_n_routed_experts or n_routed_experts" in line
    # without the key the loader falls back to the trunk's n_routed_experts (6): refused the same way
    path = _copy(build, tmp_path / "b", FIXTURE, lambda c: c["text_config"].pop("dspark_n_routed_experts"))
    assert "holds 3 routed experts (ids 0..2), but config.json says 6" in _error(capsys, ["inspect", str(path)])


def test_each_layout_reads_its_own_names_only(build, tmp_path: Path, capsys) -> None:
    """A V4-0731 checkpoint labelled V4.1 lacks V4.1's head names, and the reverse; a family with DSpark fields but
    no layout is refused naming the layouts there are."""
    v4_as_v41 = _copy(
        build, tmp_path, "deepseek_v4_0731_dspark", lambda c: c.update(architectures=["DeepseekV41ForCausalLM"])
    )
    line = _error(capsys, ["inspect", str(v4_as_v41)])
    assert "(the deepseek_v41 layout" in line and "no mtp.2.markov_head.embed.weight" in line
    v41_as_v4 = _copy(
        build, tmp_path, FIXTURE, lambda c: c.update(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4")
    )
    line = _error(capsys, ["convert", str(v41_as_v4), "--out", str(tmp_path / "never")])
    assert "(the deepseek_v4_0731 layout" in line and "no mtp.2.markov_head.markov_w1.weight" in line
    assert "mtp.2.hc_head_fn" in line and not (tmp_path / "never").exists()
    unknown = _copy(build, tmp_path / "u", FIXTURE, lambda c: c.update(architectures=["X"], model_type="x"))
    line = _error(capsys, ["inspect", str(unknown)])
    assert "names its stages in no layout mtp2draft reads" in line and "deepseek_v41 (DeepseekV41ForCausalLM)" in line


def test_specs_lists_the_dspark_layouts_as_supported(capsys) -> None:
    assert main(["specs", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out) if r.get("draft_kind") == "dspark"}
    assert set(rows) == set(layouts()) == {"deepseek_v4_0731", "deepseek_v41", "speculators_dspark"}
    assert all(r["supported"] is True for r in rows.values())
    assert rows["deepseek_v41"]["last_stage"]["markov_w1"] == "markov_head.embed.weight"
    assert "32 x 32" in rows["deepseek_v41"]["quantization"] and "vLLM 0.32" in rows["deepseek_v41"]["sources"]
    assert main(["specs"]) == 0
    section = capsys.readouterr().out.split("\nDSpark drafters")[1].split("\n\n")[0].splitlines()[1:]
    assert [line.split()[0] for line in section] == sorted(rows)


def test_the_32_block_is_read_wherever_the_config_keeps_quantization_config(build, tmp_path: Path, capsys) -> None:
    """Moved under text_config, the [32, 32] block still decides the dequantisation (one lookup, nested or not)."""
    from mtp2draft.checkpoint.fp8 import fp8_block_size

    def nest(config: dict[str, Any]) -> None:
        config["text_config"]["quantization_config"] = config.pop("quantization_config")

    path = _copy(build, tmp_path, FIXTURE, nest)
    assert fp8_block_size(json.loads((path / "config.json").read_text())) == (32, 32)
    assert main(["convert", str(path), "--out", str(tmp_path / "o"), "--dtype", "float32"]) == 0
    got, want = load_file(tmp_path / "o" / "model.safetensors"), _dequantised(_shipped(path))
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.hub
def test_over_the_hub_convert_fetches_the_v41_drafter_and_never_the_engram_tables(
    build, hub, capsys, tmp_path: Path
) -> None:
    """The Engram tables sit in a shard of garbage bytes (`decoy`): reading any of it fails, and the Hub counts what
    it serves of it. `inspect` reads headers only; `convert` fetches the stages' stored bytes and no more than 1.05x of
    them with the headers of the shards holding them (the trunk is 1.5x the drafter), and nothing of the Engram shard."""
    from mtp2draft.checkpoint.reader import open_checkpoint

    path = build(FIXTURE, decoy=ENGRAM)
    hub.add_repo("deepseek-ai/tiny-v41", path)
    local = open_checkpoint(str(path))
    shards = {f for f in local.weight_map.values() if f != "model-decoy.safetensors"}
    need = sum(local.info(k).nbytes for k in local.needed_keys(local.keys_with_prefix("mtp.")))
    info = _inspect(capsys, "deepseek-ai/tiny-v41")
    assert info["layout"] == "deepseek_v41" and info["drafter_bytes"] == need
    assert info["bytes_read_by_inspect"] == sum(hub.bytes_served_for(f) for f in shards) < need
    hub.reset_counters()
    assert main(["convert", "deepseek-ai/tiny-v41", "--out", str(tmp_path / "o")]) == 0
    served = sum(hub.bytes_served_for(f) for f in shards)
    holding = {local.weight_map[k] for k in local.needed_keys(local.keys_with_prefix("mtp."))}
    headers = sum(min(local.info(k).start for k in local.header(f)) for f in holding)
    assert need <= served <= 1.05 * (need + headers)
    assert hub.bytes_served_for("model-decoy.safetensors") == 0


def test_a_converted_v41_drafter_is_refused_by_the_stages_that_run_it_in_one_line(build, tmp_path: Path) -> None:
    """Read exactly, but V4.1's stage (no hc_head, the drafter's own experts) is not built: opening it to run says
    so instead of building V4's stage over V4.1's tensors. V4-0731's layout names the stage that runs it."""
    from mtp2draft.draft.dspark_disk import STAGES, open_dspark
    from mtp2draft.errors import DraftError

    out = tmp_path / "v41"
    assert main(["convert", str(build(FIXTURE)), "--out", str(out), "--dtype", "float32"]) == 0
    assert json.loads((out / "config.json").read_text())["layout"] == "deepseek_v41"
    with pytest.raises(DraftError, match="deepseek_v41 DSpark stages are read exactly .* cannot be run"):
        open_dspark(out, torch.zeros(1, 1), torch.zeros(1, 1))
    assert all(row.stage in STAGES for row in layouts().values() if row.stage) and not layouts()["deepseek_v41"].stage
