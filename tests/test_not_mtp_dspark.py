"""DSpark is not MTP. DeepSeek-V4-0731 / V4.1 keep a DSpark block drafter (three stages, a Markov head, no enorm /
hnorm / projection) under the same `mtp.*` prefix as DeepSeek-V4's MTP layer, and config.json says
`num_nextn_predict_layers: 1` all the same. Loading it as MTP would half-load it (vLLM 0.33 refuses `mtp` for V4.1 for
that reason), so every command that reads a source refuses it in one line naming what it is.

The fixture is DeepSeek-V4-Flash-0731's layout; its MTP keys are diffed against the key list of the release
committed as test data (tests/data/hub_keys/deepseek_v4_0731_dspark.json, sources cited there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import hub_keys
from support.fixtures import FIXTURES

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


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_every_command_refuses_in_one_line(build, tmp_path: Path, capsys, command: str) -> None:
    path = build(FIXTURE)
    argv = [command, str(path)] + (["--out", str(tmp_path / "out"), "--to", "eagle3"] if command == "convert" else [])
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "DSpark block drafter" in lines[0] and "not an MTP layer" in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
