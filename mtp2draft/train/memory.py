"""Memory plan of a distillation run, per rank, from the draft's config alone (nothing is loaded).

The draft module is built on the meta device (shapes, no storage) and its parameters are counted by name, so every
family the registry knows is covered without per-family code. Trainable are the parameters the draft itself trains
(`trainable_parameters`: a chain under the `first` rule trains layer 0 only, a final norm shared with the trunk is
frozen), as set up for `--serving-engine`, less those `--train-subset` freezes. Per rank, with N ranks, P parameters
(P_t trainable) and compute dtype bytes `a` (2 for bf16, 4 for fp32):

- parameters: 4 P / N (fp32 master copy, sharded by FSDP2);
- gradients: 4 P_t / N (fp32, sharded after reduce-scatter);
- optimizer: 8 P_t / N (AdamW's two fp32 moments, sharded);
- unsharded unit: the largest FSDP unit gathered for compute (a bytes a parameter) with its full gradient (a bytes),
  or, after the parameters are resharded, that gradient plus its fp32 copy for the reduce-scatter, whichever is
  larger. Routed experts are ONE unit: since
  transformers 5 they are fused 3-D tensors, which FSDP2 cannot split further. With one process (no FSDP) this is 0
  in fp32 and the bf16 copies autocast makes of the largest unit otherwise;
- target tensors: the frozen embedding (and head, for native drafts) every rank holds, in the compute dtype;
- activations: B/N rows x T tokens x the bytes kept for backward per token, summed over the K TTT steps:
  every linear map keeps its input and output (routed experts: for each of the top-k experts a token visits), every
  norm its input in fp32, the head its logits plus fp32 log-probs and teacher probabilities over the draft
  vocabulary, and step s's attention the keys/values of (s + 1) steps (the TTT cache); plus the target's features
  and logits the step reads. A multi-stream layer (DeepSeek-V4: S residual streams a token) also keeps its streams
  where the others keep one vector (`_stream_bytes`). Fused attention (no T x T scores kept) is assumed; with
  --activation-checkpointing the MLP keeps only its input.

What it does not cover: an online target's own weights and activations (use `dump-hidden` files for large targets),
allocator fragmentation and CUDA context (a 10 % margin is added when refusing), the host memory used to load the
draft before sharding. It is an estimate for planning; `tests/test_memory.py` compares it with the bytes autograd
really saves on a small draft.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtp2draft.draft.disk import read_draft_config
from mtp2draft.errors import OptionError
from mtp2draft.family.schema import ENGINES
from mtp2draft.kinds import DraftKind
from mtp2draft.progress import human_bytes as human
from mtp2draft.train.parallel import resolve_precision, shard_units
from mtp2draft.train.settings import DistillConfig
from mtp2draft.train.subsets import TRAIN_SUBSETS

# Linear maps whose outputs are the attention's keys/values (transformers' names: GQA, gated attention, MLA).
KV_PROJECTIONS = ("*.k_proj", "*.v_proj", "*.kv_b_proj")
MARGIN = 1.10


@dataclass
class MemoryPlan:
    subset: str
    world: int
    precision: str
    batch: int
    length: int
    ttt_steps: int
    activation_checkpointing: bool
    parameters: int
    trainable: int
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "subset": self.subset,
            "world_size": self.world,
            "precision": self.precision,
            "global_batch": self.batch,
            "max_length": self.length,
            "ttt_steps": self.ttt_steps,
            "activation_checkpointing": self.activation_checkpointing,
            "parameters": self.parameters,
            "trainable_parameters": self.trainable,
            "bytes_per_rank": dict(self.bytes),
            "total_bytes_per_rank": self.total,
        }


def meta_draft(draft_config: dict[str, Any]) -> nn.Module:
    """The draft module with shapes only (meta device): no weights are read or allocated."""
    from mtp2draft.draft.disk import build_draft

    with torch.device("meta"):
        return build_draft(draft_config)


def _per_token_activation_bytes(draft: nn.Module, a: int, top_k: int, checkpoint_mlp: bool) -> tuple[int, int]:
    """(bytes kept per token by one TTT step excluding the KV cache, KV width in elements per token)."""
    per_token, kv = 0, 0
    for name, module in draft.named_modules():
        in_mlp = ".mlp." in f".{name}." and name.split(".")[-1] != "mlp"
        if isinstance(module, nn.Linear):
            if not (checkpoint_mlp and in_mlp):
                per_token += (module.in_features + module.out_features) * a
            if any(fnmatch("." + name, pat) for pat in KV_PROJECTIONS):
                kv += module.out_features
            continue
        for pname, p in module.named_parameters(recurse=False):
            if p.dim() == 3 and not (checkpoint_mlp and in_mlp):  # fused experts [E, out, in]: top_k of them a token
                per_token += top_k * (p.shape[1] + p.shape[2]) * a
            elif (
                p.dim() == 1
                and pname == "weight"
                and len(list(module.parameters(recurse=False))) == 1
                and not (checkpoint_mlp and in_mlp)
            ):
                per_token += p.shape[0] * (a + 4)  # a norm: input kept, fp32 statistics
    if checkpoint_mlp:
        per_token += draft.hidden_size * a  # the MLP's input, kept for the recompute
    return per_token + _stream_bytes(draft, a), kv


def _stream_bytes(draft: nn.Module, a: int) -> int:
    """Bytes a multi-stream layer (`hyper.py`: its hidden is S residual streams [S, H] a token) keeps per token beyond
    what the loop above counts for one vector: hnorm and h_proj run on each of the S streams, their sum is the
    block's input, and each mixer that reads all streams flattened (a 2-D weight [m, S * H]: the block's two
    hyper-connections and the stream-reducing head; fp32 modules) keeps that fp32 input, its normalised copy and the
    Sinkhorn-mixed streams it writes back ([S, H] twice). 0 for a single-hidden layer."""
    shape = tuple(getattr(draft, "hidden_shape", ()))
    streams, h = (shape[0], shape[1]) if len(shape) == 2 else (1, 0)
    if streams <= 1:
        return 0
    mixers = sum(1 for p in draft.parameters() if p.dim() == 2 and p.shape[1] == streams * h)
    per_stream_h = (streams - 1) * h
    return per_stream_h * (a + 4) + per_stream_h * 2 * a + streams * h * a + mixers * streams * h * (2 * 4 + 2 * a)


def _unit_peak(n: int, trainable: int, a: int) -> int:
    """Transient bytes of one FSDP unit: gathered params + their gradient during backward, then (once the params
    are resharded) the gradient plus its fp32 copy for the reduce-scatter when compute is not fp32."""
    return max(n * a + trainable * a, trainable * (a + 4) if a != 4 else 0)


def _feature_width(draft) -> int:
    """Numbers per position of the target features a draft reads: EAGLE-3's fused aux width, else its hand-over
    (hidden_size, or streams x hidden_size for a multi-stream layer)."""
    if hasattr(draft, "fc"):
        return draft.fc.in_features
    return math.prod(getattr(draft, "hidden_shape", (draft.hidden_size,)))


def plan(
    draft_config: dict[str, Any],
    config: DistillConfig | None = None,
    *,
    world: int = 1,
    precision: str = "fp32",
    subset: str | None = None,
    online_logits: bool = True,
) -> MemoryPlan:
    """Per-rank bytes of a `distill` run with the settings `config` (the module docstring says what each line
    counts), training `subset` (default: its `train_subset`), the draft trained for its `serving_engine`."""
    from mtp2draft.errors import DataError

    config = config or DistillConfig()
    batch, length, ttt_steps = config.batch_size, config.max_length, config.ttt_steps
    activation_checkpointing, serving_engine = config.activation_checkpointing, config.serving_engine
    subset = subset or config.train_subset

    if subset not in TRAIN_SUBSETS:
        raise DataError(f"--train-subset must be one of {', '.join(TRAIN_SUBSETS)}, got {subset!r}")
    draft = meta_draft(draft_config)
    # an engine that cannot serve the draft is refused by distill's own check (configure_draft) in its words
    layers = int(getattr(draft, "num_layers", 1) or 1)
    if (
        draft.kind == DraftKind.MTP
        and serving_engine in ENGINES
        and draft.spec.runs(serving_engine, draft.kind, layers)
    ):
        draft.train_for_engine(serving_engine)
    patterns = TRAIN_SUBSETS[subset][1]
    names = dict(draft.named_parameters())
    trains = {id(p) for p in draft.trainable_parameters()}

    def trained(name: str, p: nn.Parameter) -> bool:
        return id(p) in trains and not any(fnmatch(name, pat) for pat in patterns)

    total = sum(p.numel() for p in names.values())
    trainable = sum(p.numel() for n, p in names.items() if trained(n, p))
    a = 2 if precision == "bf16" else 4
    cfg = draft.config
    top_k = int(getattr(cfg, "num_experts_per_tok", None) or 1)
    vocab = draft.vocab_size
    vd = int(getattr(draft, "draft_vocab_size", vocab))
    h = draft.hidden_size

    if world > 1:
        units = shard_units(draft)
        sizes = {}
        for u in units:  # each unit's own parameters (its wrapped sub-units gathered separately)
            inner = sum(sizes.get(v, (0, 0))[0] for v in units if v.startswith(u + "."))
            inner_t = sum(sizes.get(v, (0, 0))[1] for v in units if v.startswith(u + "."))
            mod = draft.get_submodule(u)
            n_all = sum(p.numel() for p in mod.parameters()) - inner
            n_tr = sum(p.numel() for n, p in mod.named_parameters() if trained(f"{u}.{n}", p)) - inner_t
            sizes[u] = (n_all, n_tr)
        covered = sum(s[0] for s in sizes.values())
        sizes[""] = (total - covered, trainable - sum(s[1] for s in sizes.values()))
        unshard = max(_unit_peak(n, t, a) for n, t in sizes.values())
    else:
        biggest = max((p.numel() for p in names.values()), default=0)
        unshard = biggest * a if a != 4 else 0

    rows = -(-batch // world)  # the largest share
    per_token, kv = _per_token_activation_bytes(draft, a, top_k, activation_checkpointing)
    head = vd * (a + 8)
    step_bytes = sum(per_token + head + (s + 1) * kv * a for s in range(ttt_steps))
    features = _feature_width(draft) * 4 + (vocab * 4 if online_logits else 0)
    activations = rows * length * (step_bytes + features) + sum(length * length * (s + 1) * 4 for s in range(ttt_steps))
    target_tensors = vocab * h * a * (2 if draft.kind == DraftKind.MTP else 1)

    out = MemoryPlan(subset, world, precision, batch, length, ttt_steps, activation_checkpointing, total, trainable)
    out.bytes = {
        "parameters": 4 * total // world,
        "gradients": 4 * trainable // world,
        "optimizer": 8 * trainable // world,
        "unsharded_unit": unshard,
        "target_tensors": target_tensors,
        "activations": activations,
    }
    return out


def available_bytes(device: str, local_world: int = 1) -> int | None:
    """Memory this rank may use on `device`: free CUDA memory, or the host's available RAM split between local
    ranks. None when unknown."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // max(local_world, 1)
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // max(local_world, 1)
    except (ValueError, OSError):
        return None


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def render(plans: list[MemoryPlan]) -> str:
    """Plans side by side (one column each): the rows of the module docstring, then the total."""
    rows = ["parameters", "gradients", "optimizer", "unsharded_unit", "target_tensors", "activations"]
    head = ["per rank"] + [p.subset for p in plans]
    body = [
        ["trainable params"] + [f"{_count(p.trainable)} of {_count(p.parameters)}" for p in plans],
        *[[r.replace("_", " ")] + [human(p.bytes[r]) for p in plans] for r in rows],
        ["total"] + [human(p.total) for p in plans],
    ]
    p0 = plans[0]
    title = (
        f"memory plan: {p0.world} rank(s), {p0.precision}, global batch {p0.batch} x {p0.length} tokens x "
        f"{p0.ttt_steps} TTT steps" + (", activation checkpointing" if p0.activation_checkpointing else "")
    )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def check_fits(p: MemoryPlan, device: str, local_world: int = 1) -> str | None:
    """None when the plan fits what this rank sees, else the one-line reason."""
    free = available_bytes(device, local_world)
    if free is None or p.total * MARGIN <= free:
        return None
    return (
        f"this run needs about {human(p.total)} per rank (plus 10 % margin) and {device} has {human(free)} free: "
        "use more ranks, --precision bf16, a smaller --batch-size/--max-length, --activation-checkpointing or "
        "--train-subset (see `distill --plan`)"
    )


def plan_memory(
    draft_dir: str | Path,
    config: DistillConfig | None = None,
    world: int | None = None,
    device: str = "cpu",
    offline: bool = False,
) -> list[MemoryPlan]:
    """`distill --plan`: the per-rank memory plan of every trainable subset, side by side, from the draft's
    config.json alone (the chosen --train-subset first). World size: `world`, else torchrun's, else 1."""
    cfg = config or DistillConfig()
    if world is not None and (isinstance(world, bool) or world < 1):
        raise OptionError(f"--world-size must be a whole number >= 1, got {world}")
    world = world or int(os.environ.get("WORLD_SIZE", 1))
    precision = resolve_precision(cfg.precision, device)
    draft_config = read_draft_config(draft_dir)
    subsets = [cfg.train_subset] + [s for s in TRAIN_SUBSETS if s != cfg.train_subset]
    return [
        plan(draft_config, cfg, world=world, precision=precision, subset=s, online_logits=not offline) for s in subsets
    ]
