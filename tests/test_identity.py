"""A draft belongs to the target it was converted from: every key of a bundled target's config.json is mutated in
turn, and `evaluate`, `distill` and the `stitched` export each either refuse it in one line (writing nothing) or
give bit-identical output. The keys that pass are exactly `identity.INERT_FIELDS`: nothing is exempt by a guess.

The bundled targets are copied first (the originals are never written)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.target.identity import INERT_FIELDS

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["tiny-mimo", "tiny-deepseek-v3"]


# A different valid value where the generic rule below would make the field invalid (an invalid dtype is refused
# by transformers' config class; the test wants to see whether a *valid* change is inert).
VALID_CHANGES = {"torch_dtype": "float16", "dtype": "float16", "transformers_version": "9.9.9"}


def _mutated(value, key: str = ""):
    """A different value of a config field, of the same type where one exists."""
    if key in VALID_CHANGES:
        return VALID_CHANGES[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 if value else 0.1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, value[-1]] if value else [1]
    if isinstance(value, dict):
        return {**value, "mutated": 1}
    return {"rope_type": "linear", "factor": 2.0}  # None: rope_scaling is the one null field of both targets


@pytest.fixture(scope="module", params=TARGETS)
def bundle(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    target = root / "target"
    shutil.copytree(REPO / "examples" / "targets" / request.param, target)
    draft = root / "draft"
    convert(str(target), draft, dtype="float32")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n" for i in range(2)))
    return root, target, draft, data


def _commands(draft: Path, target: Path, data: Path, out: Path) -> dict[str, list[str]]:
    common = ["--target", str(target), "--data", str(data)]
    return {
        "evaluate": ["evaluate", str(draft), *common, "-k", "2", "--max-new-tokens", "6", "--json"],
        "distill": [
            "distill",
            str(draft),
            *common,
            "--out",
            str(out),
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--max-length",
            "24",
            "--save-every",
            "1000",
            "--device",
            "cpu",
        ],  # fmt: skip
        "stitched": ["export", str(draft), "--format", "stitched", "--target", str(target), "--out", str(out)],
    }


def _result(name: str, out: Path, stdout: str, skip_key: str | None) -> object:
    """What must be bit-identical: evaluate's report without timings, the written files' bytes (the stitched
    config.json, the target's own, without the mutated key; provenance records paths and times)."""
    if name == "evaluate":
        report = json.loads(stdout)
        for r in report["results"]:
            r.pop("seconds", None)
        return report["results"]
    files = {}
    for f in sorted(out.rglob("*")):
        if f.is_file() and f.name != "provenance.json":
            if f.name == "config.json" and name == "stitched":
                cfg = json.loads(f.read_text())
                cfg.pop(skip_key, None)
                files[f.name] = cfg
            else:
                files[str(f.relative_to(out))] = f.read_bytes()
    return files


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_every_target_config_key_is_refused_or_inert(bundle, tmp_path: Path, capsys) -> None:
    root, target, draft, data = bundle
    original = json.loads((target / "config.json").read_text())
    baseline = {}
    for name, argv in _commands(draft, target, data, tmp_path / "base").items():
        shutil.rmtree(tmp_path / "base", ignore_errors=True)
        code, out, err = _run(argv, capsys)
        assert code == 0, err
        baseline[name] = _result(name, tmp_path / "base", out, None)
    shutil.rmtree(tmp_path / "base", ignore_errors=True)

    passed: dict[str, set[str]] = {name: set() for name in baseline}
    mutations = [(key, _mutated(value, key)) for key, value in original.items()] + [("added_by_the_test", 1)]
    try:
        for key, value in mutations:
            cfg = copy.deepcopy(original)
            cfg[key] = value
            (target / "config.json").write_text(json.dumps(cfg))
            for name, argv in _commands(draft, target, data, tmp_path / "out").items():
                code, out, err = _run(argv, capsys)
                if code == 0:
                    got, want = _result(name, tmp_path / "out", out, key), copy.deepcopy(baseline[name])
                    if isinstance(want, dict) and "config.json" in want and name == "stitched":
                        want["config.json"].pop(key, None)
                    assert got == want, f"{name} accepted {key}={value!r} and computed something else"
                    passed[name].add(key)
                else:
                    lines = [line for line in err.splitlines() if line.startswith("error:")]
                    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (key, name, err)
                    assert not (tmp_path / "out").exists(), (key, name)
                shutil.rmtree(tmp_path / "out", ignore_errors=True)
    finally:
        (target / "config.json").write_text(json.dumps(original, indent=2) + "\n")
    for name, keys in passed.items():  # only the documented inert fields pass, and only those of this target
        assert keys <= INERT_FIELDS, (name, keys - INERT_FIELDS)
    assert passed["evaluate"] == INERT_FIELDS & set(original)


def test_rope_theta_and_rms_norm_eps_are_named(bundle, tmp_path: Path, capsys) -> None:
    root, target, draft, data = bundle
    original = (target / "config.json").read_text()
    try:
        for key, value in (("rope_theta", 12345.0), ("rms_norm_eps", 1e-3)):
            cfg = json.loads(original)
            cfg[key] = value
            (target / "config.json").write_text(json.dumps(cfg))
            for name, argv in _commands(draft, target, data, tmp_path / "out").items():
                code, out, err = _run(argv, capsys)
                assert code == 2 and f"{key} " in err and "not the target" in err, (name, err)
                assert not (tmp_path / "out").exists()
    finally:
        (target / "config.json").write_text(original)
