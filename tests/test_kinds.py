"""Draft kinds: the enum, the one detector of a draft's kind from config.json, and the format -> kind map."""

from __future__ import annotations

import json

import pytest

from mtp2draft.errors import DraftError
from mtp2draft.formats import FORMATS, VALIDATE_FORMATS, format_kind
from mtp2draft.kinds import DRAFT_KINDS, DraftKind, detect_kind


def test_kinds_are_plain_strings_in_json_messages_and_choices() -> None:
    assert DRAFT_KINDS == ("mtp", "eagle3")
    assert json.dumps({"draft_kind": DraftKind.MTP}) == '{"draft_kind": "mtp"}'
    assert f"{DraftKind.EAGLE3}" == "eagle3" and DraftKind("mtp") is DraftKind.MTP
    assert DraftKind.EAGLE3.a_draft == "an EAGLE-3" and DraftKind.MTP.a_draft == "a native MTP"


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ({"draft_kind": "mtp", "architectures": ["MiMoForCausalLM"]}, DraftKind.MTP),
        ({"architectures": ["LlamaForCausalLMEagle3"]}, DraftKind.EAGLE3),
        ({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}, DraftKind.EAGLE3),
    ],
)
def test_detect_kind_reads_each_draft_layout(config: dict, kind: DraftKind) -> None:
    assert detect_kind(config) is kind


def test_detect_kind_refuses_a_target_config_and_says_why() -> None:
    with pytest.raises(DraftError, match=r"neither .* \(export reads directories\)"):
        detect_kind({"architectures": ["DeepseekV3ForCausalLM"]}, "export reads directories")


def test_every_format_names_its_kind() -> None:
    assert {format_kind(f) for f in VALIDATE_FORMATS} == set(DraftKind)
    assert format_kind("mtp") is DraftKind.MTP and all(format_kind(f) is k for f, k in FORMATS.items())
    with pytest.raises(ValueError):
        format_kind("gguf")
