"""The one check of every tensor mtp2draft reads: a floating dtype (or, for the few index tensors, the one they are
written in) and no NaN / Inf. Drafts, baselines and the best weights a resumed run reads back (`draft/disk.py`), the
draft tensors every exporter reads (`formats/`), `validate` and `push` (through `validate`), and a dump's shared
embedding and head (`target/dump_checks.py`) all go through `tensor_problem`.

Why: an integer tensor loads into a float parameter as truncated values, and one NaN weight makes the draft's logits
NaN, so greedy acceptance reads as perfect: both would be evaluated, trained on, exported and pushed as if fine.

What this module does not do: check names or shapes (each reader knows what it expects), or read files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from mtp2draft.errors import TensorError

# The index tensors of an EAGLE-3 draft (draft id -> target id offsets, target-id mask), in the dtypes written.
INDEX_TENSORS: dict[str, tuple[torch.dtype, ...]] = {"d2t": (torch.int64,), "t2d": (torch.bool,)}
# Elements checked at once: isfinite builds temporaries several times the size of what it checks (a whole lm_head
# would cost more than the tensor itself).
FINITE_CHUNK = 1 << 20


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def nonfinite_counts(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(NaN count, Inf count) of a floating `tensor` that holds any, else None (checked in chunks)."""
    if not (tensor.is_floating_point() and tensor.numel()):
        return None
    flat = tensor.detach().reshape(-1)
    wide = flat.element_size() == 1  # FP8: isfinite is not implemented for 1-byte floats
    if all(bool(torch.isfinite(c.float() if wide else c).all()) for c in flat.split(FINITE_CHUNK)):
        return None
    t = flat.float()
    return int(torch.isnan(t).sum()), int(torch.isinf(t).sum())


def tensor_problem(
    name: str, tensor: torch.Tensor, index: Mapping[str, tuple[torch.dtype, ...]] = INDEX_TENSORS
) -> str | None:
    """What is wrong with tensor `name` (None: nothing): an index tensor (`index`) in another dtype, any other
    tensor not floating point, or NaN / Inf."""
    allowed = index.get(name)
    if allowed is not None:
        if tensor.dtype not in allowed:
            return f"{name} is {_name(tensor.dtype)}, expected {' or '.join(_name(d) for d in allowed)}"
        return None
    if not tensor.is_floating_point():
        return f"{name} is {_name(tensor.dtype)}: weights must be floating point (it would load as truncated values)"
    counts = nonfinite_counts(tensor)
    if counts is not None:
        return f"{name} holds non-finite values ({counts[0]} NaN, {counts[1]} Inf of {tensor.numel()})"
    return None


def check_tensors(
    where: str | Path,
    tensors: Mapping[str, torch.Tensor],
    index: Mapping[str, tuple[torch.dtype, ...]] = INDEX_TENSORS,
    action: str = "refusing to use it",
) -> None:
    """Raise one TensorError line naming `where` (the file), the first bad tensor and what is wrong with it."""
    for name, tensor in tensors.items():
        problem = tensor_problem(name, tensor, index)
        if problem is not None:
            raise TensorError(f"{where}: {problem}: {action}")
