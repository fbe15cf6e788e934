"""The formats registry: every registered format's module provides what `export`, `validate`, the model card and
`run` ask of it, and a new format is one module plus one registry entry (shown with a toy format)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from mtp2draft import formats
from mtp2draft.family.spec import registry
from mtp2draft.formats import FORMATS, REGISTRY, VALIDATE_FORMATS, ExportJob, Format, Registration, get_format
from mtp2draft.kinds import DraftKind


def test_every_registered_format_provides_a_full_format() -> None:
    assert list(FORMATS) == [
        "sglang",
        "speculators",
        "nextn",
        "stitched",
        "speculators-mtp",
        "speculators-dspark",
    ]  # --format choices, in order
    assert (*FORMATS, "mtp", "stitched-dspark") == VALIDATE_FORMATS
    writers_for_another = {w for reg in REGISTRY.values() for w in reg.also.values()}  # stitched-dspark
    assert writers_for_another <= set(REGISTRY)
    for name, reg in REGISTRY.items():
        fmt = get_format(name)
        assert isinstance(fmt, Format), name
        assert (fmt.write is not None) == (reg.exportable or name in writers_for_another), name
        assert callable(fmt.validate) and callable(fmt.detect) and callable(fmt.launch_lines) and callable(fmt.usable)
        assert reg.description and reg.kind in DraftKind
        if reg.needs_target:
            assert reg.reads_target, name


def test_each_detector_recognises_its_own_config_and_no_other() -> None:
    configs = {
        "sglang": {"architectures": ["LlamaForCausalLMEagle3"]},
        "speculators": {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"},
        "nextn": {"architectures": ["DeepseekV3ForCausalLMNextN"]},
        "speculators-mtp": {"architectures": ["MTPDraftModel"], "speculators_model_type": "mtp"},
        "mtp": {"draft_kind": "mtp", "architectures": []},
        "speculators-dspark": {"architectures": ["Qwen3DSparkModel"], "speculators_model_type": "dspark"},
        "stitched-dspark": {
            "architectures": ["DeepseekV4ForCausalLM"],
            "dspark_block_size": 5,
            "dspark_target_layer_ids": [1, 2],
            "dspark_noise_token_id": 7,
            "dspark_markov_rank": 4,
        },
    }
    for name, config in configs.items():
        assert [f for f in configs if get_format(f).detect(config)] == [name]
    assert get_format("stitched").detect({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"})
    assert not get_format("stitched").detect({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def test_run_picks_a_usable_format_of_the_kind_for_every_family() -> None:
    from mtp2draft.conversion import default_kind
    from mtp2draft.pipeline import default_format

    for spec in registry().values():
        kind = default_kind(spec)
        fmt = default_format(spec, kind)
        assert FORMATS[fmt] is kind
        if any(get_format(f).usable(spec) for f in FORMATS if FORMATS[f] is kind):
            assert get_format(fmt).usable(spec), (spec.name, fmt)


def test_a_new_format_is_one_module_and_one_registry_entry(build, tmp_path: Path, monkeypatch) -> None:
    """A toy format copying the native draft's weights: registered once, it is exported, validated, detected and
    given launch lines without touching export.py, hub/card.py or the CLI's code."""
    from mtp2draft.conversion import convert
    from mtp2draft.formats.export import detect_format, export, read_draft_directory, validate
    from mtp2draft.formats.serving import launch_lines

    def write(job: ExportJob) -> None:
        shutil.copyfile(job.src / "model.safetensors", job.out / "model.safetensors")
        (job.out / "config.json").write_text(json.dumps({"toy_format": True, "from": job.cfg["spec"]}))
        job.record["toy"] = "copied"

    def check(path: Path, cfg: dict) -> list[str]:
        return [] if (path / "model.safetensors").is_file() else ["model.safetensors is missing"]

    module = types.ModuleType("mtp2draft.formats.toy")
    module.PROVIDES = {
        "toy": Format(
            write=write,
            validate=check,
            detect=lambda config: bool(config.get("toy_format")),
            launch_lines=lambda target, draft, k: {"toy engine": f"toy serve {target} --draft {draft} -k {k}"},
            usable=lambda spec: True,
        )
    }
    monkeypatch.setitem(sys.modules, "mtp2draft.formats.toy", module)
    monkeypatch.setitem(REGISTRY, "toy", Registration(DraftKind.MTP, "toy", "a toy copy", detect_rank=-1))

    draft = tmp_path / "draft"
    convert(str(build("mimo")), draft, to="mtp")
    result = export(draft, "toy", tmp_path / "out")
    assert sorted(result.files) == ["config.json", "model.safetensors", "provenance.json"]
    assert result.provenance["export"]["toy"] == "copied"
    assert detect_format(json.loads((tmp_path / "out" / "config.json").read_text())) == "toy"
    found = read_draft_directory(tmp_path / "out")
    assert found.format == "toy" and found.config == {"toy_format": True, "from": "mimo"}
    assert validate(tmp_path / "out") == [] and validate(found) == []
    (tmp_path / "out" / "model.safetensors").unlink()
    assert validate(tmp_path / "out") == ["model.safetensors is missing"]
    assert launch_lines("toy", "t", "d", 2) == {"toy engine": "toy serve t --draft d -k 2"}
    assert formats.format_kind("toy") is DraftKind.MTP


def test_a_directory_is_read_and_its_format_told_in_one_place(tmp_path: Path) -> None:
    """`read_draft_directory`: a named format stands (config.json is still read), an unnamed one is detected, and a
    directory that is none, or has no config.json, or names no known format, is one DraftError."""
    from mtp2draft.errors import DraftError
    from mtp2draft.formats.export import read_draft_directory

    with pytest.raises(DraftError, match="is not a directory"):
        read_draft_directory(tmp_path / "absent")
    with pytest.raises(DraftError, match="has no config.json"):
        read_draft_directory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(DraftError, match="cannot tell the format from config.json"):
        read_draft_directory(tmp_path)
    with pytest.raises(DraftError, match="--format must be one of .*got 'nope'"):
        read_draft_directory(tmp_path, "nope")
    named = read_draft_directory(tmp_path, "sglang")
    assert named.format == "sglang" and named.config == {"architectures": ["LlamaForCausalLM"]}
