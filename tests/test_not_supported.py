"""Families mtp2draft knowingly does not convert (model_specs/not_supported/): Gemma 4 assistants, Kimi-K3, MiniMax-M3,
MiniMax-M2 and Qwen3.8-Flash-Next are listed by `specs` and `specs --json` with their reasons, and a checkpoint of
each (fixtures in their release's layout, tests/data/families/<name>.json) is refused by `inspect` and `convert` in
one line carrying that reason, where "no spec matches" would say nothing of why.

What this module does not do: the DSpark refusal, which holds whatever the family (tests/test_not_mtp_dspark.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fixtures import FIXTURES

from mtp2draft.cli.app import main
from mtp2draft.errors import NotSupportedError, SpecError, UnknownFamilyError
from mtp2draft.family import not_supported
from mtp2draft.family.identity import FamilyIdentity
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_spec, registry

# row -> words its reason must carry (what a user is told, checked against the sources the row cites)
ROWS = {
    "gemma4_assistant": ("separate draft checkpoint", "KV cache"),
    "kimi_k3": ("no kimi_k3 model", "DSpark"),
    "minimax_m3": ("does not support MTP", "issue 13"),
    "minimax_m2": ("MTP weights are unpublished",),
    "qwen4_exp": ("no reference computation", "drops mtp.*"),
}


def test_the_rows_are_the_five_families_with_their_reasons() -> None:
    rows = not_supported.rows()
    assert sorted(rows) == sorted(ROWS)
    for name, words in ROWS.items():
        assert all(w in rows[name].reason for w in words), name
        assert any(w in rows[name].sources for w in ("0.34", "issue", "5.25")), name  # every fact names its source
    assert not set(rows) & set(registry())  # a family is either supported or not


def test_specs_lists_them_as_not_supported(capsys) -> None:
    assert main(["specs", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in table if r["supported"] and "draft_kind" not in r] == list(registry())
    refused = {r["name"]: r for r in table if not r["supported"]}
    assert sorted(refused) == sorted(ROWS)
    assert all(refused[n]["reason"] == not_supported.rows()[n].reason for n in ROWS)
    assert main(["specs"]) == 0
    text = capsys.readouterr().out.split("\nnot supported\n", 1)[1]
    for name, row in not_supported.rows().items():
        (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
        assert row.reason in line and row.architectures[0] in line


def test_a_row_and_a_spec_share_one_identity_and_one_matching_rule() -> None:
    """`NotSupported` and `Spec` are both a `FamilyIdentity` (name, description, architectures, model_types), matched
    by its one rule: the same identity as a row and as a spec matches the same configs and prints the same fields."""
    for cls in (not_supported.NotSupported, Spec):
        assert issubclass(cls, FamilyIdentity)
        assert cls.matches is FamilyIdentity.matches and cls.by_architecture is FamilyIdentity.by_architecture
    spec = registry()["deepseek_v3"]
    identity = {f: getattr(spec, f) for f in ("name", "description", "architectures", "model_types")}
    row = not_supported.NotSupported(**identity, reason="a reason", sources="a source")
    configs = [FIXTURES[name]["config"] for name in sorted(FIXTURES)]
    assert [row.matches(c) for c in configs] == [spec.matches(c) for c in configs]
    assert any(spec.matches(c) for c in configs) and not all(spec.matches(c) for c in configs)  # it can tell
    assert {k: v for k, v in row.summary().items() if k in identity} == {k: spec.summary()[k] for k in identity}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_find_spec_refuses_by_architecture_or_model_type(name: str) -> None:
    config = FIXTURES[name]["config"]
    assert FIXTURES[name]["spec"] is None
    for probe in (config, {"model_type": config["model_type"]}, {"architectures": config["architectures"]}):
        with pytest.raises(NotSupportedError, match=f"not supported, because .*{ROWS[name][0]}"):
            find_spec(probe)
    # an unrelated family still gets "no spec matches", and NotSupportedError is an UnknownFamilyError
    with pytest.raises(UnknownFamilyError, match="no spec matches") as caught:
        find_spec({**config, "architectures": ["SomethingElse"], "model_type": "something_else"})
    assert not isinstance(caught.value, NotSupportedError)


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_every_command_refuses_in_one_line(build, tmp_path: Path, capsys, name: str, command: str) -> None:
    path = build(name)
    argv = [command, str(path)] + (["--out", str(tmp_path / "out")] if command == "convert" else [])
    assert main(argv) == 2
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and not_supported.rows()[name].reason in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_minimax_m2_fixture_declares_mtp_but_holds_none(build) -> None:
    """The release's case: config.json says three MTP modules, the checkpoint holds no MTP tensor at all."""
    path = build("minimax_m2")
    config = json.loads((path / "config.json").read_text())
    assert config["use_mtp"] is True and config["num_mtp_modules"] == 3
    keys = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    n = config["num_hidden_layers"]
    assert not [k for k in keys if k.startswith("mtp.") or k.startswith(f"model.layers.{n}.")]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"reason": ""}, "reason must be a non-empty string"),
        ({"architectures": "X"}, "architectures must be a list of strings"),
        ({"architectures": [], "model_types": []}, "must match at least one"),
        ({"engines": {}}, "unknown key"),
        ({"name": "other"}, "must equal the file name"),
    ],
)
def test_a_malformed_row_is_one_line(change: dict, words: str) -> None:
    good = json.loads(json.dumps(not_supported.rows()["minimax_m2"].summary()))
    good.pop("supported")
    data = {**good, **change}
    with pytest.raises(SpecError, match=words):
        not_supported.parse(data, "model_specs/not_supported/minimax_m2.toml")
