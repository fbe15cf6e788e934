"""The model card's 'Predicted speed' section: the speed model run for the family's real checkpoint, from the
draft's measured acceptance.

Which config: the target's own when its hub id is one whose config ships with mtp2draft (nothing is downloaded);
otherwise the shipped config of the family's real checkpoint (the one the draft's spec matches), and the card says
which config it used. Which machine: H200s,
as few (a power of two, at most 8) as hold the weights in 90 % of their memory, TP over all of them; context 4096.
The draft is priced at the real checkpoint's size: a native MTP draft as its MTP layer, an EAGLE-3 draft as one
Llama-shaped layer at the checkpoint's hidden size with an `fc` and the full vocabulary (its trained draft
vocabulary belongs to the checkpoint it was converted from, which may be a toy).

What this module does not do: write the card (`hub/card.py`) or fail a push: no acceptance, no family config, or any
problem building the prediction gives no section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtp2draft.errors import Mtp2DraftError
from mtp2draft.family.spec import find_spec
from mtp2draft.kinds import EAGLE3_ARCHITECTURE
from mtp2draft.speed.accelerators import ACCELERATORS
from mtp2draft.speed.cost import draft_cost, mtp_draft_cost, target_cost, text_config
from mtp2draft.speed.model import Acceptance, Deployment, predict
from mtp2draft.speed.published import load_config, shipped_configs
from mtp2draft.speed.text import card_lines

CARD_GPU = "h200"
CARD_CONTEXT = 4096


def family_config(target: str | None, family: str | None) -> tuple[str, dict[str, Any]] | None:
    """(hub id, config) to predict for: the target's shipped config, else the shipped config the spec named `family`
    matches (the family's real checkpoint)."""
    shipped = shipped_configs()
    if target in shipped:
        return target, load_config(target)  # type: ignore[arg-type]
    for repo in sorted(shipped):
        cfg = load_config(repo)
        try:
            if family and find_spec(cfg).name == family:
                return repo, cfg
        except Mtp2DraftError:
            continue
    return None


def _card_tp(weight_bytes: float) -> int:
    memory = ACCELERATORS[CARD_GPU].memory_bytes * 0.9
    return next((tp for tp in (1, 2, 4, 8) if weight_bytes / tp <= memory), 8)


def _eagle3_at(cfg: Mapping[str, Any]) -> dict[str, Any]:
    text = text_config(cfg)
    heads = int(text["num_attention_heads"])
    h = int(text["hidden_size"])
    return {
        "architectures": [EAGLE3_ARCHITECTURE],
        "hidden_size": h,
        "intermediate_size": int(text.get("intermediate_size") or 4 * h),
        "num_attention_heads": heads,
        "num_key_value_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": h // heads,
        "num_hidden_layers": 1,
        "vocab_size": int(text["vocab_size"]),
        "torch_dtype": "bfloat16",
    }


def card_section(kind: str, target: str | None, family: str | None, evaluation: Mapping | None) -> list[str]:
    """The section's markdown lines for a draft of `kind` ('mtp' or 'eagle3') built for `target` of spec `family`,
    or [] when there is nothing honest to say."""
    results = (evaluation or {}).get("results") or []
    per = results[0].get("acceptance_per_position") if results else None
    found = family_config(target, family)
    if not per or found is None:
        return []
    repo, cfg = found
    try:
        acceptance = Acceptance(tuple(float(a) for a in per), "this draft's evaluation.json")
        target_model = target_cost(cfg, repo)
        draft = mtp_draft_cost(cfg) if kind == "mtp" else draft_cost(_eagle3_at(cfg), "EAGLE-3 layer")
        tp = _card_tp(target_model.weight_bytes())
        report = predict(target_model, draft, acceptance, Deployment(ACCELERATORS[CARD_GPU], tp, context=CARD_CONTEXT))
    except (Mtp2DraftError, KeyError, TypeError, ValueError):
        return []
    if repo == target:
        subject = f"`{repo}`"
    else:
        subject = (
            f"`{repo}`, the family's real checkpoint: the target this draft was built from (`{target or '?'}`) is "
            f"not one whose config ships with mtp2draft, so the prediction used `{repo}`'s config"
        )
    return card_lines(report, subject)


__all__ = ["card_section", "family_config"]
