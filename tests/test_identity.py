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
from mtp2draft.target.identity import INERT_FIELDS, config_differences

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
    for name, argv in _commands(draft, target, data, tmp_path / "out").items():  # the same --out (READMEs name it)
        code, out, err = _run(argv, capsys)
        assert code == 0, err
        baseline[name] = _result(name, tmp_path / "out", out, None)
        shutil.rmtree(tmp_path / "out", ignore_errors=True)

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


# DeepSeek-V3's published rope_scaling, verbatim (deepseek-ai/DeepSeek-V3 config.json; R1, V3.1, V3.2 and Kimi-K2
# publish the same legacy `type` form).
DEEPSEEK_V3_ROPE = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}


def test_a_release_rope_block_passes_every_stage_verbatim(tmp_path: Path, capsys) -> None:
    """The release's legacy rope_scaling (the bundled tiny-deepseek-v3 carries it): the draft records it as published
    (transformers' in-place rewrite of the dict must not reach the record) and every later stage accepts the draft
    against its own target."""
    target = tmp_path / "target"
    shutil.copytree(REPO / "examples" / "targets" / "tiny-deepseek-v3", target)
    cfg = json.loads((target / "config.json").read_text())
    assert cfg["rope_scaling"] == DEEPSEEK_V3_ROPE
    draft = tmp_path / "draft"
    convert(str(target), draft, dtype="float32")
    recorded = json.loads((draft / "config.json").read_text())["target_config"]
    assert recorded == cfg and recorded["rope_scaling"] == DEEPSEEK_V3_ROPE
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"text": "def f(x):\n    return x + 1\n"}) + "\n")
    for name, argv in _commands(draft, target, data, tmp_path / "out").items():
        code, _, err = _run(argv, capsys)
        assert code == 0, (name, err)
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert json.loads((target / "config.json").read_text()) == cfg  # the target is never written


def _as_transformers_rewrites(config: dict) -> dict:
    """`config` with its rope_scaling as transformers' config class leaves the dict it was given (rope_theta and
    rope_type added): what drafts converted before the fix recorded."""
    out = copy.deepcopy(config)
    out["rope_scaling"] = {**out["rope_scaling"], "rope_theta": out["rope_theta"], "rope_type": "yarn"}
    return out


def test_identity_compares_both_sides_after_one_normalisation() -> None:
    target = {"model_type": "deepseek_v3", "rope_theta": 10000, "max_position_embeddings": 163840}
    target["rope_scaling"] = copy.deepcopy(DEEPSEEK_V3_ROPE)
    assert config_differences("deepseek_v3", _as_transformers_rewrites(target), target) == []
    modern = {k: v for k, v in target.items() if k not in ("rope_scaling", "rope_theta")}
    modern["rope_parameters"] = {**_as_transformers_rewrites(target)["rope_scaling"]}
    del modern["rope_parameters"]["type"]
    assert config_differences("deepseek_v3", modern, target) == []  # transformers 5's spelling of the same RoPE
    for change in ({"factor": 32}, {"type": "linear"}, {"mscale_all_dim": 0.707}, {"extra": 1}):
        other = copy.deepcopy(target)
        other["rope_scaling"].update(change)
        assert config_differences("deepseek_v3", target, other), change
    assert config_differences("deepseek_v3", target, {**target, "rope_theta": 50000})
    glm = {"model_type": "glm4_moe", "partial_rotary_factor": 0.5, "rope_theta": 1000000}
    assert config_differences("glm4_moe", glm, {**glm, "partial_rotary_factor": 1.0}) == [
        "rope.partial_rotary_factor 0.5 (draft) vs 1.0 (target)"
    ]


def test_building_a_transformers_config_leaves_the_record_alone() -> None:
    from mtp2draft.draft.block_config import hf_config

    fields = {"hidden_size": 64, "rope_theta": 10000, "rope_scaling": copy.deepcopy(DEEPSEEK_V3_ROPE)}
    hf_config("deepseek_v3", fields)
    assert fields["rope_scaling"] == DEEPSEEK_V3_ROPE
