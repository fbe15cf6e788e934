"""The `speculators-mtp` format: a native draft written as speculators 0.9.0's `mtp` speculator type.

The reference for the weights is speculators' own converter, restated here from its source (speculators 0.9.0
`speculators/convert/mtp/converter.py`: `MTP_EXACT_REMAP`, `MTP_PREFIX_REMAP`, `_fuse_moe_experts`) and applied to the
target checkpoint's `mtp.*` tensors: an undistilled draft's export must hold exactly what speculators would extract.
tests/testing/test_engine_speculators.py loads the exports with speculators itself (its own venv).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.references import tensors

from mtp2draft.conversion import convert
from mtp2draft.errors import DraftError
from mtp2draft.family.spec import get_spec
from mtp2draft.formats import FORMATS, ExportConfig
from mtp2draft.formats.export import detect_format, export, validate
from mtp2draft.formats.speculators_mtp import served_families

# speculators 0.9.0 speculators/convert/mtp/converter.py, as written there
MTP_EXACT_REMAP = {
    "mtp.fc.weight": "mtp_layers.0.input_proj.weight",
    "mtp.norm.weight": "mtp_layers.0.final_layernorm.weight",
}
MTP_PREFIX_REMAP = [
    ("mtp.pre_fc_norm_hidden.", "mtp_layers.0.hidden_layernorm."),
    ("mtp.pre_fc_norm_embedding.", "mtp_layers.0.token_layernorm."),
    ("mtp.layers.0.", "mtp_layers.0."),
]
SPEC_OF = {"qwen3_next": "qwen3_next", "qwen3_5": "qwen3_5_text"}  # fixture -> its family's spec
EXPERT = re.compile(r"^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def speculators_extraction(target: Path) -> dict[str, torch.Tensor]:
    """What speculators' `MTPConverter.convert_to_state_dict` makes of a target: its `mtp.*` tensors renamed, the
    per-expert weights fused into `experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj`."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for key, value in tensors(target).items():
        if not key.startswith("mtp."):
            continue
        name = MTP_EXACT_REMAP.get(key) or next(
            (d + key[len(s) :] for s, d in MTP_PREFIX_REMAP if key.startswith(s)), key
        )
        if m := EXPERT.match(name):
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = value
        else:
            out[name] = value
    for prefix, by_index in experts.items():
        ordered = [by_index[i] for i in range(len(by_index))]
        out[prefix + ".gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in ordered])
        out[prefix + ".down_proj"] = torch.stack([e["down_proj"] for e in ordered])
    return out


def _export(build, tmp_path: Path, fixture: str, **config) -> Path:
    target = build(fixture)
    convert(str(target), tmp_path / "draft", to="mtp", dtype="float32")
    settings = ExportConfig(**{"dtype": "float32", "verifier": str(target), **config})
    return export(tmp_path / "draft", "speculators-mtp", tmp_path / "spec", config=settings).out


def test_the_families_speculators_serves_are_declared_in_their_specs() -> None:
    # speculators 0.9.0 models/mtp/model_definitions.py: mtp_model_classes has qwen3 (no MTP checkpoint family
    # here), qwen3_next, qwen3_5_text, qwen3_5_moe_text
    assert served_families() == {
        "qwen3_5_moe_text": "qwen3_5_moe_text",
        "qwen3_5_text": "qwen3_5_text",
        "qwen3_next": "qwen3_next",
    }
    assert "speculators-mtp" in FORMATS


@pytest.mark.parametrize("fixture", ["qwen3_next", "qwen3_5"])
def test_export_holds_what_speculators_extracts_from_the_target(build, tmp_path: Path, fixture: str) -> None:
    out = _export(build, tmp_path, fixture, speculative_tokens=4)
    weights = load_file(str(out / "model.safetensors"))
    reference = speculators_extraction(build(fixture))
    assert sorted(weights) == sorted(reference)
    for name, want in reference.items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], want.float()), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MTPDraftModel"] and cfg["speculators_model_type"] == "mtp"
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["dtype"] == "float32"
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "mtp" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0]["proposal_type"] == "greedy"
    assert sc["proposal_methods"][0]["speculative_tokens"] == 4
    target_cfg = json.loads((build(fixture) / "config.json").read_text())
    assert sc["verifier"] == {"name_or_path": str(build(fixture)), "architectures": target_cfg["architectures"]}
    layer = cfg["transformer_layer_config"]
    text = target_cfg.get("text_config", target_cfg)  # Qwen3.5 nests it: speculators reads the text config
    assert layer["model_type"] == text["model_type"] == get_spec(SPEC_OF[fixture]).speculators.mtp_model_type
    assert layer["num_hidden_layers"] == text["num_hidden_layers"]  # speculators' target_layer_ids reads it
    assert detect_format(cfg) == "speculators-mtp" and validate(out) == []


def test_an_unsupported_family_is_refused_in_one_line(build, tmp_path: Path) -> None:
    convert(str(build("deepseek_v3")), tmp_path / "draft", to="mtp", dtype="float32")
    with pytest.raises(DraftError) as err:
        export(tmp_path / "draft", "speculators-mtp", tmp_path / "spec")
    assert str(err.value) == (
        "speculators 0.9.0 has no mtp speculator type for deepseek_v3 targets; it serves qwen3_5_moe_text, "
        "qwen3_5_text, qwen3_next (a spec's [speculators] mtp_model_type)"
    )
    assert not (tmp_path / "spec").exists()


def test_validate_checks_the_contract(build, tmp_path: Path) -> None:
    out = _export(build, tmp_path, "qwen3_next")
    cfg = json.loads((out / "config.json").read_text())
    weights = load_file(str(out / "model.safetensors"))

    def problems(config: dict, state: dict) -> list[str]:
        (out / "config.json").write_text(json.dumps(config))
        save_file(state, str(out / "model.safetensors"))
        return validate(out, "speculators-mtp")

    extra = {**weights, "embed_tokens.weight": torch.zeros(256, 64)}
    assert problems(cfg, extra) == [
        "embed_tokens.weight is present: speculators would use it instead of the verifier's"
    ]
    gone = {k: v for k, v in weights.items() if k != "mtp_layers.0.input_proj.weight"}
    assert problems(cfg, gone) == [
        "mtp_layers.0.input_proj.weight is missing (speculators would leave it at its initialisation)"
    ]
    renamed = {("mtp.fc.weight" if k.endswith("input_proj.weight") else k): v for k, v in weights.items()}
    assert "mtp.fc.weight is not a tensor of speculators' qwen3_next MTP layer" in problems(cfg, renamed)
    half = {k: v.to(torch.bfloat16) if k.endswith("final_layernorm.weight") else v for k, v in weights.items()}
    assert problems(cfg, half) == ["mtp_layers.0.final_layernorm.weight is bfloat16, config.json says float32"]
    two = {**cfg, "num_nextn_predict_layers": 2}
    assert problems(two, weights) == ["num_nextn_predict_layers is 2; speculators' mtp needs 1"]
    llama = {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"], "model_type": "llama"}}
    assert problems(llama, weights) == [
        "transformer_layer_config.model_type is 'llama'; speculators' mtp type builds qwen3_5_moe_text, "
        "qwen3_5_text, qwen3_next"
    ]
    no_k = {**cfg, "speculators_config": {**cfg["speculators_config"], "proposal_methods": []}}
    assert problems(no_k, weights) == [
        "speculators_config.proposal_methods is missing or empty (vLLM reads k from the first)"
    ]
