"""The engine facts in the specs (`[engines.*]`): the support table and where it is shown, the per-engine MTP
computation a native draft is trained for, and the defaults they drive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, default_kind
from mtp2draft.draft.disk import load_draft
from mtp2draft.errors import SpecError
from mtp2draft.family.spec import get_spec, parse_spec, registry
from mtp2draft.formats.serving import launch_lines
from mtp2draft.pipeline import default_format

# Read from vLLM 0.33.0 / SGLang 0.5.23 sources (see each spec's `sources`); written out here so a wrong spec fails.
NO_EAGLE3 = {
    "sglang": {
        "mimo",
        "ernie4_5_moe",
        "mimo_v2_flash",
        "hy_v3",
        "glm_ocr",
        "nemotron_h",
        "bailing_hybrid",
        "nemotron_h_omni",
        "deepseek_v4",  # SGLang 0.5.23 captures V4's aux states for its DSpark drafter only
        "step3p7",  # step3p5.py / step3p7.py set no eagle3 layers to capture
        "mimo_v2",  # as MiMo-V2-Flash: MiMoV2ForCausalLM has no set_eagle3_layers_to_capture
        "hy_v4",  # hunyuan_v4.py: HYV4ForCausalLM has no set_eagle3_layers_to_capture
    },
    "vllm": {
        "glm4_moe",
        "ernie4_5_moe",
        "longcat_flash",
        "mimo",
        "glm4_moe_lite",
        "hy_v3",
        "glm_ocr",
        "exaone4_5",
        "exaone_moe",
        "bailing_hybrid",
        "step3p7",  # vLLM 0.34: Step3p7ForConditionalGeneration (step3_vl.py) is not SupportsEagle3
        "hy_v4",  # vLLM 0.34: hy_v4/nvidia/model.py's HYV4ForCausalLM is not SupportsEagle3
    },
}
VLLM_PRE_NORM_HANDOVER = {"glm4_moe", "ernie4_5_moe", "glm4_moe_lite", "glm_ocr", "deepseek_v4", "step3p7"}
# Families an engine serves with neither method (SGLang 0.5.23 has no EXAONE-4.5 MTP class and no MTP path for
# NemotronH_Super_Omni_Reasoning_V3; no engine source read names Step-5-Preview's step3p5v): no table for it.
NOT_SERVED = {"sglang": {"exaone4_5", "nemotron_h_super_omni", "step3p5v"}, "vllm": {"step3p5v"}}


# the engine versions the specs' facts were read from; a family only a later engine serves, or read from a later one,
# cites that one
ENGINE_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}
READ_AT = {
    "step3p7": {"vllm": "0.34.0", "sglang": "0.5.23"},  # read from vLLM 0.34's step3p5_mtp.py
    "deepseek_v4": {"vllm": "0.34.0", "sglang": "0.5.23"},  # DeepSeekV4MTP first appears in vLLM 0.34
    "mimo_v2": {"vllm": "0.34.0", "sglang": "0.5.23"},  # the per-chunk qkv scales: vLLM 0.34's MTP loader
    "glm5_next": {"vllm": "0.34.0", "sglang": "0.5.23"},  # vllm/models/glm5next/ (0.34's layout)
    "qwen3_5_flat": {"vllm": "0.34.0", "sglang": "0.5.23"},  # read from vllm/models/qwen3_5/nvidia/ (0.34)
    "hy_v4": {"vllm": "0.34.0", "sglang": "0.5.23"},  # HYV4MTP first appears in vLLM 0.34 (models/hy_v4/nvidia/mtp.py)
}


def test_support_table_matches_the_engines() -> None:
    for spec in registry().values():
        for engine in ("vllm", "sglang"):
            if spec.name in NOT_SERVED[engine]:
                assert spec.engine(engine) is None and not any(spec.support_table()[engine].values()), spec.name
                continue
            assert spec.serves(engine, "mtp"), (spec.name, engine)
            assert spec.serves(engine, "eagle3") == (spec.name not in NO_EAGLE3[engine]), (spec.name, engine)
            assert spec.engine(engine).version == READ_AT.get(spec.name, ENGINE_VERSIONS)[engine], (spec.name, engine)
        # ERNIE applies no final norm: its hand-over is the block output (recorded as pre_norm) in both engines;
        # DeepSeek-V4 hands on its residual streams before hc_head and the norm in both; Step-3.7 its block output
        # before shared_head.norm in both
        if spec.engine("sglang") is not None:
            pre_norm = spec.engine("sglang").handover == "pre_norm"
            assert pre_norm == (spec.name in {"ernie4_5_moe", "deepseek_v4", "step3p7"}), spec.name
        if spec.engine("vllm") is not None:
            assert (spec.engine("vllm").handover == "pre_norm") == (spec.name in VLLM_PRE_NORM_HANDOVER), spec.name
    ernie, mimo = get_spec("ernie4_5_moe"), get_spec("mimo")
    for engine in ("vllm", "sglang"):
        assert ernie.engine_computation(engine) == {
            "input_hidden": "post_norm",
            "final_norm": False,
            "hidden_handover": "pre_norm",
        }
    assert mimo.engine_computation("vllm")["input_hidden"] == "pre_norm"
    assert mimo.engine_computation("sglang")["input_hidden"] == "post_norm"
    sglang_rules = {s.name: s.engine("sglang").aux_ids for s in registry().values() if s.serves("sglang", "eagle3")}
    plus_one_if_first = {"deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa"}
    assert {n for n, r in sglang_rules.items() if r != "plus_one"} == plus_one_if_first


def test_engine_tables_are_validated() -> None:
    base = {
        "name": "x",
        "description": "x",
        "architectures": ["X"],
        "model_types": ["x"],
        "layer": {},
        "config": {"transformers_model_type": "llama"},
        "keys": {
            k: "k"
            for k in ("enorm", "hnorm", "proj", "final_norm", "block", "target_embed", "target_head", "target_norm")
        },
        "block": {"module": "m", "decoder_layer": "D", "norm": "n", "rotary": "r", "attention": "gqa", "mlp": "dense"},
    }
    for engines, message in [
        ({"tgi": {"version": "1"}}, "unknown engine"),
        ({"vllm": {"version": "1", "methods": ["medusa"]}}, "methods must be"),
        ({"vllm": {"version": "1", "methods": ["mtp"]}}, "needs handover"),
        ({"vllm": {"methods": []}}, "version"),
        ({"sglang": {"version": "1", "aux_ids": "minus_one"}}, "aux_ids"),
        ({"vllm": {"version": "1", "step_layers": "random"}}, "step_layers must be one of"),
        ({"vllm": {"version": "1", "config_view": "qwen2"}}, "config_view: expected a table"),
        ({"vllm": {"version": "1", "extract_drop": "model.mtp_layers."}}, "extract_drop: expected a list of strings"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_spec({**base, "engines": engines})


def test_no_table_outside_family_is_keyed_by_a_family() -> None:
    """Per-family engine facts are spec data: no dict literal in the package outside `family/` has a family's name or
    model_type as a key (the vLLM config and extraction views were such tables; now `[engines.vllm] config_view`,
    `extract_view` and `extract_drop`, read from the spec)."""
    import ast

    package = Path(__file__).resolve().parents[1] / "mtp2draft"
    names = {n for spec in registry().values() for n in (spec.name, *spec.model_types)}
    keyed = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "family":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} if isinstance(node, ast.Dict) else set()
            keyed += [f"{path.relative_to(package)}:{node.lineno} {sorted(keys & names)}"] if keys & names else []
    assert keyed == []
    mimo = get_spec("mimo").engine("vllm")
    assert dict(mimo.config_view) == {"model_type": "qwen2"} and mimo.extract_drop == ("model.mtp_layers.",)


def test_specs_command_shows_the_support_table(capsys) -> None:
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    assert "sglang 0.5.23" in out and "vllm 0.33.0" in out
    glm = [line for line in out.splitlines() if line.startswith("glm4_moe ") and "mtp [" in line]
    assert glm and "mtp [post_norm], eagle3" in glm[0] and glm[0].rstrip().endswith("mtp [pre_norm]")
    assert main(["specs", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ernie4_5_moe"]["engines"]["vllm"] == {
        **rows["ernie4_5_moe"]["engines"]["vllm"],
        "methods": ["mtp"],
        "final_norm": False,
        "hidden": "post_norm",
        "version": "0.33.0",
    }


def test_launch_lines_only_for_engines_that_can_run_them() -> None:
    glm, mimo_v2 = get_spec("glm4_moe"), get_spec("mimo_v2_flash")
    assert set(launch_lines("sglang", "zai-org/GLM-4.5-Air", "me/d", 4, glm)) == {"SGLang"}  # vLLM refuses EAGLE-3
    assert set(launch_lines("speculators", "t", "d", 4, mimo_v2)) == {"vLLM", "vLLM (speculators config)"}
    assert set(launch_lines("stitched", "t", "d", 4, glm)) == {"overlay", "vLLM", "SGLang"}
    assert launch_lines("sglang", "t", "d", 4, get_spec("mimo")) == {}


def test_run_defaults_follow_the_support_table() -> None:
    """Native MTP wherever an engine serves it (docs/notes/eagle3-from-mtp.md), then the first format an engine serves."""
    for name in ("deepseek_v3", "mimo", "ernie4_5_moe"):
        assert default_kind(get_spec(name)) == "mtp"
    assert default_format(get_spec("deepseek_v3"), "mtp") == "nextn"
    assert default_format(get_spec("mimo"), "mtp") == "stitched"  # no NextN class for MiMo
    assert default_format(get_spec("ernie4_5_moe"), "mtp") == "stitched"
    assert default_format(get_spec("deepseek_v3"), "eagle3") == "sglang"
    assert default_format(get_spec("mimo_v2_flash"), "eagle3") == "speculators"  # no SGLang aux


@pytest.mark.parametrize(
    ("engine", "final_norm", "input_hidden"), [("vllm", False, "post_norm"), (None, True, "pre_norm")]
)
def test_distill_trains_ernie_for_the_engine_named(
    target, text_data, tmp_path: Path, engine, final_norm: bool, input_hidden: str
) -> None:
    """ERNIE-4.5 in vLLM and SGLang: post-norm step-0 hidden, no final norm (so logits and hand-over read the block
    output). `--serving-engine vllm` trains exactly that, and the draft config and the model card say so."""
    from distill_requests import online

    from mtp2draft.hub.card import model_card
    from mtp2draft.train.recipe import distill
    from mtp2draft.train.settings import DistillConfig

    tgt = target("ernie4_5_moe")
    convert(str(tgt), tmp_path / "raw", to="mtp", dtype="float32")
    config = DistillConfig(steps=2, batch_size=2, max_length=32, save_every=2, log_every=1, serving_engine=engine)
    distill(online(tmp_path, tgt, "ft", text_data, config=config))
    cfg = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert cfg["final_norm"] is final_norm and cfg["input_hidden"] == input_hidden
    assert (cfg["engine"] or {}).get("name") == engine
    draft = load_draft(tmp_path / "ft")
    assert draft.apply_final_norm is final_norm and draft.input_hidden == input_hidden
    h = draft.hidden_size
    draft.attach_target(torch.randn(draft.vocab_size, h), torch.randn(draft.vocab_size, h))
    with torch.no_grad():
        x = torch.randn(1, 5, h)
        normed, out = draft.layer_forward(torch.randn(1, 5, h), x, torch.arange(5)[None])
    assert torch.equal(normed, out) is (not final_norm)
    card = str(model_card(tmp_path / "ft"))
    assert ("Trained for vllm 0.33.0's MTP computation" in card) is (engine == "vllm")


def test_distill_refuses_an_engine_that_cannot_serve_the_draft(target, text_data, tmp_path: Path) -> None:
    from distill_requests import online

    from mtp2draft.errors import DataError
    from mtp2draft.train.recipe import distill
    from mtp2draft.train.settings import DistillConfig

    tgt = target("glm4_moe", num_hidden_layers=4)
    convert(str(tgt), tmp_path / "e3", to="eagle3", dtype="float32")
    with pytest.raises(DataError, match="vllm 0.33.0 cannot serve a eagle3 draft for glm4_moe"):
        distill(
            online(tmp_path, tgt, "ft", text_data, draft="e3", config=DistillConfig(steps=1, serving_engine="vllm"))
        )
