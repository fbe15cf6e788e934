"""Where a model runs: a `--device` checked against what this machine has, and the default (cuda when available).

One place for every command that places the target or the draft (evaluate, distill, run, the online teacher), so a
device the machine lacks is the same one-line error everywhere. What this module does not do: shard or spread a
model (`train.parallel`, transformers' `device_map`).
"""

from __future__ import annotations

import torch


def resolve_device(device: str | None) -> str:
    """`None` -> cuda when available, else cpu; a device this machine lacks is refused (`check_device`)."""
    if device:
        check_device(device)
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str | torch.device) -> torch.device:
    """`device` as torch names it, or an OptionError (one line, no traceback) when torch knows no such device
    (`foo`) or this machine has none (`cuda` without a GPU, `cuda:3` on a machine of two)."""
    from mtp2draft.errors import OptionError

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise OptionError(f"--device {device!r}: not a device torch knows (cpu, cuda, cuda:N, mps, ...)") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":  # shapes without storage: nothing can be loaded or trained there
        raise OptionError(f"--device {device}: a meta device holds no data; use cpu or cuda")
    backend = getattr(torch, dev.type, None)
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available) or not is_available():
        raise OptionError(f"--device {device}: this machine has no {dev.type} device")
    count = getattr(backend, "device_count", None)
    if dev.index is not None and callable(count) and dev.index >= count():
        raise OptionError(f"--device {device}: this machine has {count()} {dev.type} device(s)")
    return dev
