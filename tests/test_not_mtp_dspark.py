"""DSpark is not MTP. DeepSeek-V4-0731 / V4.1 keep a DSpark block drafter (three stages, a Markov head, no enorm /
hnorm / projection) under the same `mtp.*` prefix as DeepSeek-V4's MTP layer, and config.json says
`num_nextn_predict_layers: 1` all the same. Loading it as MTP would half-load it (vLLM 0.33 refuses `mtp` for V4.1 for
that reason). `inspect` reports it as a DSpark drafter, found by its `dspark_*` keys; every other command refuses it
in one line naming what it is and what is supported so far.

The fixture is DeepSeek-V4-Flash-0731's layout; its MTP keys are diffed against the key list of the release
committed as test data (tests/data/hub_keys/deepseek_v4_0731_dspark.json, sources cited there).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import hub_keys
from support.fixtures import FIXTURES, write_char_tokenizer

from mtp2draft.cli.app import main
from mtp2draft.errors import NotMtpError, UnknownFamilyError
from mtp2draft.family.spec import find_spec

FIXTURE = "deepseek_v4_0731_dspark"


def _weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def test_fixture_has_the_release_dspark_keys(build) -> None:
    release = hub_keys.load(FIXTURE)
    path = build(FIXTURE)
    ours = [k for k in _weight_map(path) if k.startswith("mtp.")]
    assert hub_keys.patterns(ours, "") == set(release["mtp_key_patterns"])
    assert hub_keys.experts(ours) == set(range(FIXTURES[FIXTURE]["config"]["n_routed_experts"]))
    # the pattern list and the release's per-stage tensor counts (a second stored source) agree at 256 experts
    experts = release["config"]["n_routed_experts"]
    for stage, count in release["stage_tensor_counts"].items():
        stage_patterns = [p for p in release["mtp_key_patterns"] if p.startswith(f"mtp.{stage}.")]
        per_expert = [p for p in stage_patterns if "{e}" in p]
        assert len(stage_patterns) - len(per_expert) + experts * len(per_expert) == count, stage
    # nothing of an MTP layer: no enorm / hnorm / eh_proj / e_proj / h_proj
    assert not [k for k in ours if any(n in k for n in ("enorm", "hnorm", "eh_proj", "e_proj", "h_proj"))]
    config = json.loads((path / "config.json").read_text())
    assert {k: config[k] for k in ("architectures", "model_type", "num_nextn_predict_layers")} == {
        k: release["config"][k] for k in ("architectures", "model_type", "num_nextn_predict_layers")
    }
    assert {k for k in release["config"] if k.startswith("dspark_")} <= set(config)


def test_find_spec_refuses_a_dspark_config_of_any_family(build) -> None:
    config = json.loads((build(FIXTURE) / "config.json").read_text())
    with pytest.raises(NotMtpError, match=r"DSpark block drafter .*dspark_block_size = 5"):
        find_spec(config)
    # the field decides, ahead of family matching: a DeepSeek-V3 config carrying it is refused too
    with pytest.raises(NotMtpError, match="DSpark"):
        find_spec({**FIXTURES["deepseek_v3"]["config"], "dspark_block_size": 5})
    with pytest.raises(NotMtpError, match="DSpark"):
        find_spec({"architectures": ["X"], "text_config": {"dspark_block_size": 7}})
    # without the DSpark fields, the same config is DeepSeek-V4's, whose MTP layer is converted
    base = {k: v for k, v in config.items() if not k.startswith("dspark_")}
    assert find_spec(base).name == "deepseek_v4"
    with pytest.raises(UnknownFamilyError, match="DeepseekV4X"):
        find_spec({**base, "architectures": ["DeepseekV4X"], "model_type": "x"})
    assert find_spec(FIXTURES["deepseek_v3"]["config"]).name == "deepseek_v3"


@pytest.mark.parametrize("extra", [["--to", "eagle3"], ["--to", "mtp"], ["--layer", "1"], ["--all-layers"]])
def test_convert_refuses_mtp_layer_options_in_one_line(build, tmp_path: Path, capsys, extra: list[str]) -> None:
    path = build(FIXTURE)
    assert main(["convert", str(path), "--out", str(tmp_path / "out"), *extra]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "DSpark block drafter" in lines[0] and "not an MTP layer" in lines[0], err
    assert extra[0] in lines[0] and "one dspark draft directory" in lines[0]
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def _stored_mtp_tensors(path: Path) -> dict[str, tuple[str, int]]:
    """mtp.* name -> (dtype, bytes), from the shards' safetensors headers as the format defines them."""
    out = {}
    for shard in sorted(set(_weight_map(path).values())):
        raw = (path / shard).read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        for name, meta in header.items():
            if name.startswith("mtp."):
                start, end = meta["data_offsets"]
                out[name] = (meta["dtype"], end - start)
    return out


@pytest.mark.parametrize("nextn", [1, 0, 3])
def test_inspect_reports_the_dspark_drafter(build, tmp_path: Path, capsys, nextn: int) -> None:
    """Stages come from the tensors and detection from dspark_* keys: num_nextn_predict_layers changes nothing."""
    path = build(FIXTURE, num_nextn_predict_layers=nextn)
    assert main(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    stored = _stored_mtp_tensors(path)
    config = FIXTURES[FIXTURE]["config"]
    assert info["draft_kind"] == "dspark" and info["num_stages"] == 3 and info["num_nextn_predict_layers"] == nextn
    assert {k: info["dspark"][k] for k in ("block_size", "target_layer_ids", "noise_token_id", "markov_rank")} == {
        "block_size": 5,
        "target_layer_ids": config["dspark_target_layer_ids"],
        "noise_token_id": config["dspark_noise_token_id"],
        "markov_rank": config["dspark_markov_rank"],
    }
    for row in info["stages"]:
        mine = {k: v for k, v in stored.items() if k.startswith(f"mtp.{row['stage']}.")}
        assert row["tensors"] == len(mine) and row["bytes"] == sum(b for _, b in mine.values())
    assert info["drafter_bytes"] == sum(b for _, b in stored.values())
    heads = {t["name"]: t for t in info["head_tensors"]}
    assert heads["mtp.0.main_proj.weight"]["shape"] == [config["hidden_size"], 3 * config["hidden_size"]]
    assert heads["mtp.0.main_proj.weight"]["dtype"] == stored["mtp.0.main_proj.weight"][0] == "F8_E4M3"
    assert heads["mtp.2.confidence_head.proj.weight"]["shape"] == [1, config["hidden_size"] + 8]
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "DSpark block drafter" in text and "block size    5" in text and "distills and evaluates them" in text


def test_inspect_refuses_dspark_fields_over_tensors_that_are_not_dspark(build, tmp_path: Path, capsys) -> None:
    """The config's keys say DSpark; the tensors must agree, or inspect says which are missing."""
    path = Path(shutil.copytree(build("deepseek_v4"), tmp_path / "v4"))  # a copy: the built fixture is shared
    config = json.loads((path / "config.json").read_text())
    dspark = hub_keys.load(FIXTURE)["config"]
    config.update({k: v for k, v in dspark.items() if k.startswith("dspark_")})
    (path / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "declares a DSpark drafter (dspark_block_size = 5) but mtp.* is not one: no mtp.0.main_proj.weight" in err


def _dequantised_release(path: Path) -> dict[str, torch.Tensor]:
    """The shipped mtp.* tensors in float32, dequantised here by the formats' definitions: FP8 e4m3 times its e8m0
    scale per 128 x 128 block; packed e2m1 (element 2i in the low nibble) times its e8m0 scale per 32 inputs."""
    raw: dict[str, torch.Tensor] = {}
    for shard in sorted(set(_weight_map(path).values())):
        raw.update({k: v for k, v in load_file(path / shard).items() if k.startswith("mtp.")})
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    out = {}
    for key, t in raw.items():
        if key.endswith(".scale"):
            continue
        scale = raw.get(key.removesuffix(".weight") + ".scale")
        if scale is None:
            out[key] = t.float()
        elif t.dtype == torch.int8:  # FP4 routed expert: [N, K/2] bytes, scale [N, K/32]
            u8 = t.view(torch.uint8).long()
            values = torch.stack([e2m1[u8 & 0xF], e2m1[u8 >> 4]], dim=-1).flatten(-2)
            out[key] = values * scale.float().repeat_interleave(32, dim=1)
        else:  # FP8 block: [N, K], scale [ceil(N/128), ceil(K/128)]
            grid = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)
            out[key] = t.float() * grid[: t.shape[0], : t.shape[1]]
    return out


def test_convert_writes_the_stages_equal_to_the_shipped_tensors_dequantised(build, tmp_path: Path, capsys) -> None:
    path = build(FIXTURE)
    out = tmp_path / "dspark"
    assert main(["convert", str(path), "--out", str(out), "--dtype", "float32"]) == 0
    assert "wrote dspark draft" in capsys.readouterr().out
    got, want = load_file(out / "model.safetensors"), _dequantised_release(path)
    assert set(got) == set(want) and len({k.split(".")[1] for k in got}) == 3
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert any(
        t.dtype == torch.int8 for t in load_file(path / _weight_map(path)["mtp.0.ffn.experts.0.w1.weight"]).values()
    )
    config = json.loads((out / "config.json").read_text())
    assert config["draft_kind"] == "dspark" and config["num_stages"] == 3 and config["dspark"]["block_size"] == 5
    # bf16 by default; the tensors stored as float32 (hyper-connection mixers) stay float32
    assert main(["convert", str(path), "--out", str(tmp_path / "bf16")]) == 0
    bf16 = load_file(tmp_path / "bf16" / "model.safetensors")
    assert bf16["mtp.0.hc_attn_fn"].dtype == torch.float32 and bf16["mtp.0.attn.wq_a.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(
        bf16["mtp.0.main_proj.weight"].float(), want["mtp.0.main_proj.weight"], rtol=1e-2, atol=0
    )


@pytest.mark.parametrize("command", ["export"])  # a format of another kind
def test_stages_refuse_a_dspark_draft_directory_saying_what_is_supported(
    build, tmp_path: Path, capsys, command
) -> None:
    path, draft = build(FIXTURE), tmp_path / "dspark"
    assert main(["convert", str(path), "--out", str(draft)]) == 0
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello there"}\n')
    argv = {
        "distill": ["--target", str(path), "--data", str(data), "--out", str(tmp_path / "o"), "--steps", "1"],
        "evaluate": ["--target", str(path), "--data", str(data)],
        "export": ["--format", "speculators", "--out", str(tmp_path / "o")],
    }[command]
    capsys.readouterr()
    assert main([command, str(draft), *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    if command == "distill":  # distill takes DSpark drafters; the target here is the release the stages came from
        assert len(lines) == 1 and "DSpark" in lines[0], err
    else:
        why = "takes an EAGLE-3 draft" if command == "export" else "are a DSpark block drafter"
        assert len(lines) == 1 and why in lines[0] and "DSpark" in lines[0], err
        said = "use --format stitched or speculators-dspark" if command == "export" else ""
        assert said in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.hub
def test_over_the_hub_inspect_reads_headers_and_convert_fetches_the_drafter_only(
    build, hub, capsys, tmp_path: Path
) -> None:
    """Byte ranges as for an MTP layer: `inspect` reads shard headers only; `convert` fetches the stages' stored
    bytes and no more than 1.05x of them with the headers of the shards holding them. The trunk is never fetched."""
    from mtp2draft.checkpoint.reader import open_checkpoint

    path = build(FIXTURE)
    hub.add_repo("deepseek-ai/tiny-v4-dspark", path)
    local = open_checkpoint(str(path))
    stored = _stored_mtp_tensors(path)
    need = sum(b for _, b in stored.values())
    shards = set(local.weight_map.values())
    assert main(["inspect", "deepseek-ai/tiny-v4-dspark", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["bytes_read_by_inspect"] == sum(hub.bytes_served_for(f) for f in shards)
    assert info["drafter_bytes"] == need and info["bytes_read_by_inspect"] < need
    hub.reset_counters()
    assert main(["convert", "deepseek-ai/tiny-v4-dspark", "--out", str(tmp_path / "o")]) == 0
    served = sum(hub.bytes_served_for(f) for f in shards)
    holding = {local.weight_map[k] for k in stored}
    headers = sum(min(local.info(k).start for k in local.header(f)) for f in holding)
    assert need <= served <= 1.05 * (need + headers)


def test_dspark_fields_read_either_section_and_refuse_malformed_ones() -> None:
    from mtp2draft.errors import CheckpointError
    from mtp2draft.family.dspark import dspark_fields

    release = hub_keys.load(FIXTURE)["config"]
    dspark = {k: v for k, v in release.items() if k.startswith("dspark_")}
    assert dspark_fields({k: v for k, v in release.items() if not k.startswith("dspark_")}) is None
    top = dspark_fields(release)
    nested = dspark_fields({"architectures": ["X"], "text_config": {**dspark, "num_nextn_predict_layers": 3}})
    assert top is not None and nested is not None and top.summary() == nested.summary()
    assert (top.block_size, top.target_layer_ids, top.noise_token_id, top.markov_rank) == (5, (40, 41, 42), 128799, 256)
    assert nested.section == "config.json text_config"
    for bad, message in (
        ({"dspark_block_size": 0}, "dspark_block_size = 0 is not a whole number"),
        ({"dspark_target_layer_ids": [41, 40, 42]}, "is not strictly increasing"),
        ({"dspark_target_layer_ids": []}, "is not a list of target layers"),
        ({"dspark_markov_rank": "256"}, "dspark_markov_rank = '256'"),
    ):
        with pytest.raises(CheckpointError, match=message):
            dspark_fields({**release, **bad})


def test_evaluate_runs_a_release_s_stages_against_that_release_lossless(build, tmp_path: Path, capsys) -> None:
    """The release is the target (its trunk; the DSpark stages are the draft): block drafting through DeepSeek-V4's
    stage, the output equal to the target's own greedy decoding."""
    path, draft = tmp_path / "release", tmp_path / "dspark"
    shutil.copytree(build(FIXTURE), path)
    write_char_tokenizer(path)  # ids within the fixture's 256-token vocabulary
    assert main(["convert", str(path), "--out", str(draft), "--dtype", "float32"]) == 0
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello there, general"}\n{"text": "one two three four"}\n')
    capsys.readouterr()
    argv = ["evaluate", str(draft), "--target", str(path), "--data", str(data), "--max-new-tokens", "12", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["lossless"] is True


def test_distill_fine_tunes_a_release_s_stages_and_writes_them_under_its_names(build, tmp_path: Path) -> None:
    """The V4 stages distilled against their own release (its trunk the frozen target): the result keeps the
    release's tensor names and shapes, opens again as the same kind of drafter, and its weights moved."""
    from mtp2draft.draft.dspark_disk import open_dspark

    path, draft, out = tmp_path / "release", tmp_path / "dspark", tmp_path / "tuned"
    shutil.copytree(build(FIXTURE), path)
    write_char_tokenizer(path)
    assert main(["convert", str(path), "--out", str(draft), "--dtype", "float32"]) == 0
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i}: the quick brown fox {i * 7}"}) + "\n" for i in range(8)))
    argv = ["distill", str(draft), "--target", str(path), "--data", str(data), "--out", str(out), "--steps", "2",
            "--batch-size", "2", "--max-length", "32", "--anchors", "4", "--lr", "1e-2"]  # fmt: skip
    assert main(argv) == 0
    before, after = load_file(draft / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after) and all(before[k].shape == after[k].shape for k in before)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("mtp.0.attn."))
    assert json.loads((out / "config.json").read_text())["draft_kind"] == "dspark"
    embed = torch.zeros(FIXTURES[FIXTURE]["config"]["vocab_size"], FIXTURES[FIXTURE]["config"]["hidden_size"])
    assert type(open_dspark(out, embed, embed)).__name__ == "DSparkV4Draft"
