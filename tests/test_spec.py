"""Spec files: validation, matching, and that a new family is one spec file + one fixture row."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mtp2draft.errors import SpecError, UnknownFamilyError
from mtp2draft.family.spec import SPEC_PATH_ENV, find_spec, get_spec, load_spec_file, parse_spec, registry

SPEC_DIR = Path(__file__).resolve().parents[1] / "model_specs"


def _data(name: str = "deepseek_v3") -> dict:
    return tomllib.loads((SPEC_DIR / f"{name}.toml").read_text())


def test_every_shipped_spec_loads_and_is_named_after_its_file() -> None:
    files = sorted(p.stem for p in SPEC_DIR.glob("*.toml"))
    assert files == sorted(registry())
    for name in files:
        assert load_spec_file(SPEC_DIR / f"{name}.toml").name == name


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("colour",), "red", r"unknown key\(s\) colour"),
        (("keys", "extra"), "x", r"unknown key\(s\) extra"),
        (("layer", "concat"), "sideways", "layer.concat must be one of"),
        (("layer", "norm"), "fancy", "layer.norm must be one of"),
        (("keys", "enorm"), "model.layers.{layer}.enorm.weight", "placeholder"),
        (("quantization",), ["int3"], "unknown quantization"),
        (("verified",), "yes", "expected true/false"),
    ],
)
def test_malformed_specs_are_rejected(path: tuple[str, ...], value, message: str) -> None:
    data = _data()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpecError, match=message):
        parse_spec(data, "test.toml")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("block", "load"), ["no_such_transform"], "unknown transform 'no_such_transform'"),
        (("eagle3", "transforms"), ["attention_nope"], "unknown transform 'attention_nope'"),
    ],
)
def test_unknown_transform_names_are_rejected_by_the_transform_registry(path, value, message: str) -> None:
    """Spec loading stays torch-free: transform names are checked where the registries live (and before any use)."""
    from mtp2draft.eagle3.transforms import check_eagle3_transforms
    from mtp2draft.family.transforms import check_spec_transforms

    data = _data()
    data[path[0]][path[1]] = value
    spec = parse_spec(data, "test.toml")
    check = check_eagle3_transforms if path[0] == "eagle3" else check_spec_transforms
    with pytest.raises(SpecError, match=message):
        check(spec)


def test_missing_required_section_is_rejected() -> None:
    data = _data()
    del data["keys"]
    with pytest.raises(SpecError, match=r"missing section \[keys\]"):
        parse_spec(data, "test.toml")


def test_find_spec_matches_architectures_then_model_type() -> None:
    assert find_spec({"architectures": ["DeepseekV3ForCausalLM"]}).name == "deepseek_v3"
    assert find_spec({"model_type": "glm4_moe"}).name == "glm4_moe"
    assert find_spec({"architectures": ["MiMoForCausalLM"], "model_type": "mimo"}).name == "mimo"


def test_unknown_family_points_at_the_list() -> None:
    """One short line that counts the families and names the command listing them (listing them all inline made
    a 1,173-character line)."""
    with pytest.raises(UnknownFamilyError) as err:
        find_spec({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    assert f"knows {len(registry())} families" in str(err.value) and "`mtp2draft specs`" in str(err.value)
    assert len(str(err.value)) < 300
    with pytest.raises(UnknownFamilyError, match="supported"):
        get_spec("nope")


def test_a_new_family_is_one_spec_file_and_one_fixture_row(tmp_path: Path, monkeypatch, build) -> None:
    """A made-up family reusing the Qwen2 block kind, with its own key names and architecture: no code change."""
    from support import fixtures

    from mtp2draft.conversion import convert
    from mtp2draft.draft.layout import load_native

    spec_text = (SPEC_DIR / "mimo.toml").read_text()
    spec_text = spec_text.replace('name = "mimo"', 'name = "toy_mtp"')
    spec_text = spec_text.replace('["MiMoForCausalLM"]', '["ToyMtpForCausalLM"]').replace('["mimo"]', '["toy_mtp"]')
    spec_text = spec_text.replace("model.mtp_layers.{i}.", "model.nextn.{i}.")
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "toy_mtp.toml").write_text(spec_text)
    monkeypatch.setenv(SPEC_PATH_ENV, str(folder))
    registry.cache_clear()
    try:
        row = {**fixtures.FIXTURES["mimo"], "spec": "toy_mtp"}
        row["config"] = {**row["config"], "architectures": ["ToyMtpForCausalLM"], "model_type": "toy_mtp"}
        monkeypatch.setitem(fixtures.FIXTURES, "toy_mtp", row)
        ckpt = fixtures.build_fixture("toy_mtp", tmp_path / "ckpt")
        index = json.loads((ckpt / "model.safetensors.index.json").read_text())
        assert any(k.startswith("model.nextn.0.") for k in index["weight_map"])
        result = convert(str(ckpt), tmp_path / "draft")
        assert result.spec == "toy_mtp"
        assert load_native(str(ckpt)).spec.name == "toy_mtp"
    finally:
        registry.cache_clear()


def test_the_layer_count_of_a_config_without_num_hidden_layers_is_its_layers_block_type() -> None:
    """Nemotron-3 Ultra's config.json has no num_hidden_layers: transformers' NemotronHConfig derives it from
    layers_block_type, and so does the spec; a config with neither is refused in one line."""
    spec = get_spec("nemotron_h")
    assert spec.num_layers({"layers_block_type": ["mamba", "moe", "attention"]}) == 3
    assert spec.num_layers({"num_hidden_layers": 4, "layers_block_type": ["mamba"]}) == 4
    with pytest.raises(SpecError, match="no 'num_hidden_layers'"):
        spec.num_layers({})
