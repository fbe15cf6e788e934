"""Scaling `distill` out on torch's own stack: torchrun process groups, FSDP2, mixed precision, DCP checkpoints.

- **Launch**: `torchrun --nproc-per-node N -m mtp2draft distill ...`. torchrun sets RANK / WORLD_SIZE / LOCAL_RANK;
  `Parallel.from_env` joins the process group (NCCL on CUDA, gloo on CPU). Without torchrun nothing is initialised
  and `distill` runs exactly as a single-process program.
- **Batch**: `--batch-size` is the GLOBAL batch. Rank r takes rows [r*B//N, (r+1)*B//N) of the step's batch, and the
  loss is normalised by the GLOBAL count of loss tokens per TTT step (all-reduced before backward), scaled by N
  because FSDP averages gradients over ranks: the summed gradient is the 1-rank gradient, so the run does not depend
  on N beyond fp32 reduction order.
- **Sharding**: FSDP2 (`fully_shard`) over the draft's large sub-modules (any module holding >= 10 % of the draft's
  parameters that is not already covered, innermost first: e.g. an MoE block's fused routed experts, its MLP, the
  attention), then the root. The frozen target embedding / head are non-persistent buffers on the draft: FSDP2 never
  shards buffers and no optimizer sees them.
- **Precision**: `bf16` = `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: parameters, gradients and
  AdamW moments stay fp32 (sharded), compute runs in bf16; without FSDP (one process) the same thing is torch.autocast.
  `fp32` changes nothing (the CPU / gloo default).
- **Activation checkpointing**: the block's MLP only. Its attention is not recomputed: it appends to a KV cache that
  grows over the TTT steps, and a recompute would see the cache of later steps.
- **Checkpoints**: `torch.distributed.checkpoint` (DCP) with `get_state_dict` / `set_state_dict`, keyed by parameter
  name: every rank writes its shards into a temporary folder, rank 0 adds `state.json` and renames it, so a rank
  killed mid-save leaves no half checkpoint; DCP reshards on load, so a run resumes on any world size (one process
  without torchrun included).

What this module does not do: launch processes (torchrun does), shard the target (online targets are loaded whole on
every rank; targets too large for that go through `dump-hidden` files), or tensor/expert parallelism.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mtp2draft.manifest import write_json
from mtp2draft.outputs.checkpoint_folder import make_checkpoint_folder, remove_checkpoint_folder
from mtp2draft.train.subsets import TRAIN_SUBSETS

PRECISIONS = {
    "fp32": "parameters, gradients, optimizer state and compute in fp32",
    "bf16": "fp32 parameters, gradients and optimizer state; bf16 compute (FSDP2 MixedPrecisionPolicy, fp32 reduce)",
}


def resolve_precision(precision: str | None, device: str) -> str:
    """`None` -> bf16 on CUDA, fp32 elsewhere."""
    from mtp2draft.errors import DataError

    if precision is None:
        return "bf16" if str(device).startswith("cuda") else "fp32"
    if precision not in PRECISIONS:
        raise DataError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


@dataclass
class Parallel:
    """Where this process stands: rank, world size, its device, and whether a process group is up."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str) -> Parallel:
        """Join torchrun's process group when WORLD_SIZE is set (any value, 1 included); else a single process."""
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            return cls(device=device)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if device.startswith("cuda"):
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        return cls(rank, world, local, device, True)

    def rows(self, batch: int) -> slice:
        """This rank's contiguous share of a global batch of `batch` rows."""
        return slice(self.rank * batch // self.world, (self.rank + 1) * batch // self.world)

    def sum(self, values: list[float] | list[int]) -> list[float]:
        """Element-wise sum over ranks (fp64, so counts and sums stay exact)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.distributed:
            t = t.to(self.device) if self.device.startswith("cuda") else t
            dist.all_reduce(t)
        return t.cpu().tolist()

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


# ---- the model ----------------------------------------------------------------------------------------------------------
def draft_blocks(draft: nn.Module) -> list[nn.Module]:
    """The draft's decoder blocks (native MTP: `block`; EAGLE-3: `midlayer`; a chain draft: each layer's `block`)."""
    layers = getattr(draft, "layers", None)
    if layers is not None:
        return [m.block for m in layers]
    block = getattr(draft, "block", None)
    return [block if block is not None else draft.midlayer]


def freeze_subset(draft: nn.Module, subset: str) -> list[str]:
    """Freeze the parameters the subset leaves out (requires_grad False); returns their names."""
    from fnmatch import fnmatch

    from mtp2draft.errors import DataError

    if subset not in TRAIN_SUBSETS:
        raise DataError(f"--train-subset must be one of {', '.join(TRAIN_SUBSETS)}, got {subset!r}")
    patterns = TRAIN_SUBSETS[subset][1]
    frozen = []
    for name, p in draft.named_parameters():
        if any(fnmatch(name, pat) for pat in patterns):
            p.requires_grad_(False)
            frozen.append(name)
    return frozen


def checkpoint_mlp(draft: nn.Module) -> None:
    """Recompute the block's MLP in backward instead of keeping its activations (see the module docstring)."""
    for block in draft_blocks(draft):
        _checkpoint_one(block.mlp)


def _checkpoint_one(mlp: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    inner = mlp.forward
    mlp.forward = lambda *args, **kwargs: checkpoint(inner, *args, use_reentrant=False, **kwargs)


def shard_units(draft: nn.Module, share: float = 0.10) -> list[str]:
    """Names of the sub-modules FSDP2 wraps as their own units, innermost first (see the module docstring)."""
    total = sum(p.numel() for p in draft.parameters())
    covered: dict[str, int] = {}
    units: list[str] = []
    names = [n for n, _ in draft.named_modules() if n]
    for name in sorted(names, key=lambda n: -n.count(".")):
        module = draft.get_submodule(name)
        own = sum(p.numel() for p in module.parameters()) - sum(
            c for u, c in covered.items() if u.startswith(name + ".")
        )
        if own >= share * total:
            units.append(name)
            covered[name] = own
    return units


def shard(draft: nn.Module, par: Parallel, precision: str) -> list[str]:
    """FSDP2 over the draft (in place): units from `shard_units`, then the root. Returns the unit names."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision == "bf16"
        else MixedPrecisionPolicy()
    )
    units = shard_units(draft)
    for name in units:
        fully_shard(draft.get_submodule(name), mp_policy=mp)
    fully_shard(draft, mp_policy=mp)
    # ttt_forward calls initial_hidden (EAGLE-3: the fc projection) outside forward(): it must unshard too.
    register_fsdp_forward_method(draft, "initial_hidden")
    return units


def broadcast_parameters(draft: nn.Module, par: Parallel) -> None:
    """Make every rank start from rank 0's weights and buffers (calibration may differ in the last bit on GPUs)."""
    if not par.distributed:
        return
    with torch.no_grad():
        for t in list(draft.parameters()) + [b for _, b in draft.named_buffers() if b is not None]:
            dist.broadcast(t.data, src=0)


def full_state_dict(draft: nn.Module, par: Parallel) -> dict[str, torch.Tensor] | None:
    """The whole draft's state dict on CPU (rank 0; None elsewhere). Collective under FSDP."""
    if not par.distributed:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(draft, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if par.is_main else None


# ---- checkpoints ----------------------------------------------------------------------------------------------------------
STATE_FILE = "state.json"


def save(
    folder: Path,
    step: int,
    draft: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    par: Parallel,
    keep: int = 2,
) -> Path:
    """Write step `step` with DCP (weights and AdamW state keyed by name) and keep the `keep` newest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = folder / f"step-{step:07d}"
    tmp = folder / f".step-{step:07d}.tmp"
    fresh = False
    if par.is_main:
        fresh = make_checkpoint_folder(folder)  # marked as a checkpoint folder: `--overwrite` may delete it later
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    par.barrier()
    try:
        model_sd, optim_sd = get_state_dict(draft, optimizer)
        with warnings.catch_warnings():  # one process without a group is intended, not a mistake to warn about
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=not par.distributed)
        par.barrier()  # every shard is on disk before rank 0 declares the checkpoint complete
        if par.is_main:
            write_json(tmp / STATE_FILE, {**meta, "step": step, "world_size": par.world})
            os.replace(tmp, final)
    except BaseException as exc:  # disk full, read-only, killed: no half-written checkpoint (or empty folder) is left
        failure = write_failure(exc, final)  # before the cleanup frees what the write filled
        if par.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            if fresh:
                remove_checkpoint_folder(folder)
        if failure is not None and failure is not exc:
            raise failure from exc
        raise
    if par.is_main:
        for old in sorted(folder.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    par.barrier()
    return final


def write_failure(exc: BaseException, where: Path) -> OSError | None:
    """The OSError (one line: what failed, where) behind a checkpoint write that failed for want of disk or rights:
    DCP wraps its writers' errors in a `CheckpointException`, and torch's stream writer reports a failed write as a
    RuntimeError from `inline_container.cc` (CheckpointException is a BaseException). None when `exc` is something
    else (a bug keeps its traceback, an interrupt stays an interrupt)."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):  # stays what it is, whatever it interrupted
        return None
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        failures = getattr(e, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    for e in seen:
        if (
            isinstance(e, OSError) and e.errno is not None
        ):  # the writer's own error, naming the checkpoint if it did not
            return e if e is exc and e.filename else OSError(e.errno, e.strerror, e.filename or str(where))
    for e in seen:
        text = str(e)
        if isinstance(e, RuntimeError) and ("inline_container" in text or "file write failed" in text):
            if shutil.disk_usage(where.parent).free < FULL_DISK_BYTES:
                return OSError(errno.ENOSPC, "No space left on device", str(where))
            return OSError(errno.EIO, f"could not write checkpoint {where.name} (the file write failed)", str(where))
    return None


# Free bytes under which a failed checkpoint write is said to be a full disk.
FULL_DISK_BYTES = 64 << 20


def load(path: Path, draft: nn.Module, optimizer: torch.optim.Optimizer, par: Parallel) -> dict[str, Any]:
    """Load a checkpoint written by `save` at any world size into this run's (possibly sharded) draft/optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = json.loads((path / STATE_FILE).read_text())
    model_sd, optim_sd = get_state_dict(draft, optimizer)  # the templates: this run's shapes and sharding
    state = {"model": model_sd, "optim": optim_sd}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=not par.distributed)
    set_state_dict(draft, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return meta


# ---- failing together ------------------------------------------------------------------------------------------------
def check_same_settings(par: Parallel, settings: dict[str, Any], what: str = "settings") -> None:
    """Refuse, on every rank at once, ranks started with different settings (they would wait forever on collectives
    of different shapes): a sha256 of the settings is all-gathered; on a mismatch the settings themselves are, so
    every rank names the same first differing field. A no-op on one process."""
    if not par.distributed:
        return
    import hashlib

    from mtp2draft.errors import OptionError

    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
    if par.device.startswith("cuda"):
        mine = mine.to(par.device)
    every = [torch.empty_like(mine) for _ in range(par.world)]
    dist.all_gather(every, mine)
    if all(torch.equal(t, every[0]) for t in every):
        return
    gathered: list[Any] = [None] * par.world
    dist.all_gather_object(gathered, settings)
    rank = next(r for r, t in enumerate(every) if not torch.equal(t, every[0]))
    first, other = gathered[0], gathered[rank]
    keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
    differ = ", ".join(f"{k} {other.get(k)!r} (rank 0: {first.get(k)!r})" for k in keys[:3])
    raise OptionError(
        f"torchrun ranks disagree on their {what}: rank {rank} has {differ or 'other values'}; start every rank with "
        "the same options"
    )


def together(par: Parallel, fn: Callable[[], Any]) -> Any:
    """`fn()` on every rank, failing on every rank when it fails on one: each rank's outcome is all-gathered, and a
    known error (one line) on the first failing rank r is raised everywhere, naming r, instead of leaving the other ranks waiting on
    their next collective. One all_reduce of one number per call (the messages are gathered only on a failure); a
    plain call on one process."""
    from mtp2draft.errors import Mtp2DraftError

    if not par.distributed:
        return fn()
    error: Mtp2DraftError | None = None
    try:
        out = fn()
    except Mtp2DraftError as exc:
        error, out = exc, None
    if not any(par.sum([float(error is not None)])):  # the common case: one all_reduce of one number
        return out
    failures: list[Any] = [None] * par.world
    dist.all_gather_object(failures, None if error is None else (type(error).__name__, str(error)))
    for rank, failure in enumerate(failures):
        if failure is not None:  # the first failing rank's line on every rank (naming it on the others)
            if rank == par.rank:
                raise error
            raise _error_class(failure[0])(f"rank {rank}: {failure[1]}")
    return out


def _error_class(name: str) -> type:
    from mtp2draft import errors

    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, errors.Mtp2DraftError) else errors.Mtp2DraftError


def run_main_only(par: Parallel, fn: Callable[[], Any]) -> Any:
    """Run `fn` on rank 0, then wait for it everywhere (writing results, pruning folders)."""
    out = fn() if par.is_main else None
    par.barrier()
    return out
