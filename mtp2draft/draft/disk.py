"""Draft directories on disk: read a draft's config.json (checked) and build or load the module it describes.

- a native draft (`format_version` 1 or absent): `draft.modules.NativeMtpDraft`;
- a native chain draft (`format_version` 2, `mtp_layers`): `draft.chain.MtpChainDraft`;
- an EAGLE-3 draft, in SGLang's layout or vLLM's speculators layout: `draft.eagle3.Eagle3Draft`.

What this module does not do: write draft directories (`conversion/`, `train/state.py`) or attach the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.draft.build import native_draft
from mtp2draft.draft.chain import MtpChainDraft, is_chain_config
from mtp2draft.draft.eagle3 import VOCAB_MAPS, Draft, Eagle3Draft
from mtp2draft.draft.eagle3_config import speculators_to_eagle3_config, speculators_weight_name
from mtp2draft.errors import DraftError
from mtp2draft.family.spec import get_spec
from mtp2draft.kinds import WEIGHTS_FILE, DraftKind, detect_kind

AnyDraft = Draft | MtpChainDraft


def read_draft_config(path: str | Path) -> dict[str, Any]:
    """A draft directory's config.json, checked field by field (`draft_config.load_draft_config`): one DraftError
    line naming the file, the field and the fix when a field has the wrong type, range or value."""
    from mtp2draft.draft.config import load_draft_config

    return dict(load_draft_config(path).raw)


def build_draft(cfg: Mapping[str, Any]) -> AnyDraft:
    """An uninitialised draft module from a draft config.json dict."""
    if detect_kind(cfg) is not DraftKind.MTP:
        return Eagle3Draft(cfg)
    spec, target_config = get_spec(cfg["spec"]), cfg["target_config"]
    options = {  # what a native layer computes; every layer of a chain computes the same
        "hidden_handover": cfg.get("hidden_handover"),  # absent: the layer kind's own (`DEFAULT_HANDOVER`)
        "input_hidden": cfg.get("input_hidden"),
        "final_norm": cfg.get("final_norm", True),
        "engine": cfg.get("engine"),
    }
    if is_chain_config(cfg):
        return MtpChainDraft(spec, target_config, cfg["mtp_layers"], cfg.get("step_layers", "cycle"), **options)
    return native_draft(spec, target_config, cfg.get("mtp_layer", 0), **options)


def check_draft_weights(path: str | Path) -> None:
    """Every tensor of draft directory `path` checked as `load_draft` checks it, one tensor in memory at a time: a
    command that loads several drafts (evaluate's baselines) refuses a bad one before any work, not after the first
    draft's decoding."""
    from safetensors import safe_open

    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():
        raise DraftError(f"{path} has no {WEIGHTS_FILE}")
    with safe_open(str(weights), framework="pt") as fh:
        for key in fh.keys():  # noqa: SIM118 - safe_open handles are not iterable
            check_tensors(weights, {key: fh.get_tensor(key)})


def load_draft(path: str | Path, dtype: torch.dtype = torch.float32) -> AnyDraft:
    """Load a draft directory written by `convert`, `distill` or the `sglang` / `speculators` exporters (no target
    attached). Every tensor is checked as it is read (`tensor_checks.check_tensors`): one TensorError line for an
    integer weight or a NaN / Inf."""
    path = Path(path)
    cfg = read_draft_config(path)
    rename = None
    if cfg.get("speculators_model_type"):  # vLLM's speculators layout: back to SGLang's config and names
        cfg, rename = speculators_to_eagle3_config(cfg), speculators_weight_name
    draft = build_draft(cfg)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise DraftError(f"{path} has no {WEIGHTS_FILE}")
    state = load_file(str(weights))
    check_tensors(weights, state)  # an int32 weight would load truncated, one NaN makes acceptance read as perfect
    if rename is not None:
        state = {rename(k): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
    expected = draft.state_dict()
    if isinstance(draft, Eagle3Draft) and draft.draft_vocab_size == draft.vocab_size:
        # full vocabulary: the maps are the identity, written by older versions, never by this one
        state = {**{k: expected[k] for k in VOCAB_MAPS}, **state}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise DraftError(f"{weights} does not fit its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise DraftError(
                f"{weights}: {key} has shape {list(tensor.shape)}, config implies {list(expected[key].shape)}"
            )
    draft.load_state_dict(state)
    return draft.to(dtype) if dtype is not None else draft
