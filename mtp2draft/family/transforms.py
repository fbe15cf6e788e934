"""Named load transforms that spec files refer to (`[block] load`).

- `LOAD_TRANSFORMS` map a block's checkpoint layout onto the transformers module layout and back (e.g. per-expert
  `experts.{e}.gate_proj.weight` <-> fused 3-D `experts.gate_up_proj`). Each is exact and invertible; the inverse is
  what the `stitched` exporter uses to write a fine-tuned layer back under the original key names. They live here.
- `deinterleave_qkv` / `interleave_qkv`: a fused `qkv_proj` stored pre-sharded for `chunks` tensor-parallel ranks,
  [Q_0 | K_0 | V_0 | Q_1 | K_1 | V_1 | ...] (MiMo-V2.5 / V2.5-Pro), <-> the module's separate q / k / v weights, as
  vLLM 0.34's `_shard_fp8_qkv_proj` and SGLang 0.5.23's `load_mimo_v2_qkv_proj_weight` read it.

What this module does not do: read checkpoints or write files (it works on tensors handed to it), or initialise an
EAGLE-3 layer (`eagle3.transforms.EAGLE3_TRANSFORMS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mtp2draft.errors import CheckpointError, SpecError

# ---- load transforms (checkpoint <-> module layout) ---------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One module tensor and the checkpoint tensors (block-relative keys) it is built from, in order."""

    module_key: str
    ckpt_keys: tuple[str, ...]
    transform: str = ""
    params: Any = None  # what a transform needs beyond the keys (the fused qkv's geometry), bound at plan time


def per_expert_keys(
    pattern: re.Pattern[str], keys: list[str], weights: tuple[str, ...]
) -> tuple[dict[str, tuple[list[int], tuple[dict[int, str], ...]]], list[str]]:
    """Per-expert checkpoint keys matched by `pattern` (groups p, e, w), gathered per prefix: {prefix: (experts
    0..E-1, ({expert: key} for each of `weights`))}, and the keys it does not match. Every expert must have every
    weight, and the experts must be numbered 0..E-1."""
    found: dict[tuple[str, str], dict[int, str]] = {}
    rest = []
    for key in keys:
        m = pattern.match(key)
        if not m:
            rest.append(key)
            continue
        found.setdefault((m["p"], m["w"]), {})[int(m["e"])] = key
    out = {}
    for prefix in sorted({p for p, _ in found}):
        by_weight = tuple(found.get((prefix, w), {}) for w in weights)
        experts = sorted(set().union(*by_weight))
        if experts != list(range(len(experts))) or any(set(b) != set(experts) for b in by_weight):
            raise CheckpointError(f"{prefix}experts: incomplete expert weights (experts {experts[:8]}...)")
        out[prefix] = (experts, by_weight)
    return out, rest


class FuseExperts:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` <-> transformers' fused `experts.gate_up_proj`
    [E, 2I, H] (gate rows first, then up) and `experts.down_proj` [E, H, I]."""

    name = "fuse_experts"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<e>\d+)\.(?P<w>gate|up|down)_proj\.weight$")
    WEIGHTS = ("gate", "up", "down")  # the pattern's `w` of the gate, up and down projections, in that order

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        per_prefix, rest = per_expert_keys(self.pattern, keys, self.WEIGHTS)
        groups = []
        for prefix, (experts, (gate, up, down)) in per_prefix.items():
            pairs = tuple(k for e in experts for k in (gate[e], up[e]))
            groups.append(Group(f"{prefix}experts.gate_up_proj", pairs, self.name))
            groups.append(Group(f"{prefix}experts.down_proj", tuple(down[e] for e in experts), self.name))
        return groups, rest

    def combine(self, group: Group, tensors: list[torch.Tensor]) -> torch.Tensor:
        if group.module_key.endswith("gate_up_proj"):
            # [E, 2I, H]: expert e = cat(gate_e [I, H], up_e [I, H]) along rows
            return torch.stack([torch.cat(tensors[i : i + 2], dim=0) for i in range(0, len(tensors), 2)])
        return torch.stack(tensors)  # [E, H, I]

    def combine_stream(
        self, group: Group, shape: tuple[int, ...], stream: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
    ) -> torch.Tensor:
        """`combine` filling a preallocated output expert by expert, so memory holds the output plus one expert."""
        out = torch.empty(shape, dtype=dtype)
        slot = {key: i for i, key in enumerate(group.ckpt_keys)}
        fused = group.module_key.endswith("gate_up_proj")
        for key, tensor in stream:
            i = slot[key]
            if fused:  # ckpt keys alternate gate_e, up_e: rows [0, I) and [I, 2I) of expert e
                rows = tensor.shape[0]
                out[i // 2, (i % 2) * rows : (i % 2 + 1) * rows] = tensor
            else:
                out[i] = tensor
        return out

    def out_shape(self, group: Group, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        rows, cols = shapes[0]
        if group.module_key.endswith("gate_up_proj"):
            return (len(shapes) // 2, 2 * rows, cols)
        return (len(shapes), rows, cols)

    def split(self, group: Group, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if group.module_key.endswith("gate_up_proj"):
            out = {}
            for e in range(tensor.shape[0]):
                gate, up = tensor[e].chunk(2, dim=0)
                out[group.ckpt_keys[2 * e]], out[group.ckpt_keys[2 * e + 1]] = gate, up
            return out
        return {key: tensor[e] for e, key in enumerate(group.ckpt_keys)}

    def expert_keys(self, group: Group, e: int) -> tuple[str, ...]:
        """The checkpoint keys of expert `e` in a group `group()` made: (gate, up) of `gate_up_proj`, (down,) of
        `down_proj`."""
        if group.module_key.endswith("gate_up_proj"):
            return group.ckpt_keys[2 * e : 2 * e + 2]
        return (group.ckpt_keys[e],)

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Module tensor -> per-expert checkpoint tensors (keys relative to the block); None if not ours."""
        for suffix, names in (("experts.gate_up_proj", ("gate", "up")), ("experts.down_proj", ("down",))):
            if module_key.endswith(suffix):
                prefix = module_key[: -len(suffix)]
                keys = tuple(f"{prefix}experts.{e}.{n}_proj.weight" for e in range(tensor.shape[0]) for n in names)
                return self.split(Group(module_key, keys, self.name), tensor)
        return None


class ExpertsAsStored(FuseExperts):
    """Routed experts in whichever layout the release stores them, read and written back in that layout: per-expert
    `experts.{e}.{gate,up,down}_proj.weight` (fused as `fuse_experts` does), or already fused 3-D
    `experts.gate_up_proj` [E, 2I, H] (gate rows first, then up) and `experts.down_proj` [E, H, I], with or without a
    `.weight` suffix. The fused layout is the transformers module layout itself, so those keys map 1:1 (the suffix
    dropped) and need no combining. Loaders of HY-V4 / Hy4-preview read both (RTP-LLM's HY V4 weight info probes
    `mlp.experts.gate_up_proj[.weight]`, llama.cpp's hyv4 conversion splits `experts.gate_up_proj`).

    The inverse takes the layout from the checkpoint written over (`LAYOUTS`, tried in order against the keys it
    stores); with no checkpoint to ask (tiny fixtures, NextN files) it writes `LAYOUTS[0]`."""

    name = "experts_as_stored"
    fused = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<w>gate_up|down)_proj(?:\.weight)?$")
    # the layouts, tried in this order against the checkpoint written over (`_layout_keys` names each one's keys)
    LAYOUTS: tuple[str, ...] = ("per_expert", "fused", "fused_weight")
    reads_stored = True  # `to_checkpoint` takes `has`, a predicate on block-relative checkpoint keys

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        groups, rest = super().group(keys)
        taken = {g.module_key for g in groups}
        remaining = []
        for key in rest:
            m = self.fused.match(key)
            if m is None:
                remaining.append(key)
                continue
            module_key = f"{m['p']}experts.{m['w']}_proj"
            if module_key in taken:
                raise CheckpointError(f"{key}: the experts are stored both fused and per expert (or twice)")
            taken.add(module_key)
            groups.append(Group(module_key, (key,)))  # 1:1, no transform: the stored tensor is the module's
        return groups, remaining

    def _layout_keys(self, layout: str, module_key: str, experts: int) -> tuple[str, ...]:
        if layout == "fused":
            return (module_key,)
        if layout == "fused_weight":
            return (module_key + ".weight",)
        prefix, _, which = module_key.rpartition("experts.")
        names = ("gate", "up") if which == "gate_up_proj" else ("down",)
        return tuple(f"{prefix}experts.{e}.{n}_proj.weight" for e in range(experts) for n in names)

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor, has: Any = None) -> dict[str, torch.Tensor] | None:
        if not module_key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return None
        layouts = [lay for lay in self.LAYOUTS if has is None or has(self._layout_keys(lay, module_key, 1)[0])]
        if not layouts:
            raise CheckpointError(f"the checkpoint stores {module_key} in none of the layouts {self.LAYOUTS}")
        keys = self._layout_keys(layouts[0], module_key, tensor.shape[0])
        if len(keys) == 1:
            return {keys[0]: tensor}
        return self.split(Group(module_key, keys, self.name), tensor)


class FusedExperts3d(ExpertsAsStored):
    """Checkpoints that store experts already fused, as Qwen3.5-MoE's BF16 release does: `experts.gate_up_proj`
    [E, 2I, H] (gate rows first, then up) and `experts.down_proj` [E, H, I], no `.weight` suffix. That is the
    transformers module layout itself (vLLM and SGLang split gate_up with `chunk(2, dim=-2)`, no transpose), so
    those keys map 1:1. Per-expert keys (some quantised re-releases ship them) are fused as `fuse_experts` does.
    The inverse writes the layout the checkpoint written over has; with none to ask, the fused 3-D one."""

    name = "fused_experts_3d"
    LAYOUTS = ("fused", "fused_weight", "per_expert")


class FuseUpDownExperts(FuseExperts):
    """Non-gated experts (Nemotron-H's squared-ReLU MoE): per-expert `experts.{e}.{up,down}_proj.weight` <->
        transformers' `experts.up_proj` [E, I, H] and `experts.down_proj` [E, H, I] (stacked, no `.weight` suffix; its
        conversion_mapping "nemotron_h" merges them the same way). Stacking, streaming, splitting and the per-expert
    keys are `fuse_experts`' own unfused path (a group's module key never ends in gate_up_proj here)."""

    name = "fuse_experts_up_down"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<e>\d+)\.(?P<w>up|down)_proj\.weight$")

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        per_prefix, rest = per_expert_keys(self.pattern, keys, ("up", "down"))
        groups = []
        for prefix, (experts, (up, down)) in per_prefix.items():
            for w, by_expert in (("up", up), ("down", down)):
                groups.append(Group(f"{prefix}experts.{w}_proj", tuple(by_expert[e] for e in experts), self.name))
        return groups, rest

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Module tensor -> per-expert checkpoint tensors (keys relative to the block); None if not ours."""
        for w in ("up", "down"):
            suffix = f"experts.{w}_proj"
            if module_key.endswith(suffix):
                prefix = module_key[: -len(suffix)]
                keys = tuple(f"{prefix}experts.{e}.{w}_proj.weight" for e in range(tensor.shape[0]))
                return self.split(Group(module_key, keys, self.name), tensor)
        return None


class FuseExpertsW13(FuseExperts):
    """DeepSeek's own expert names (the V4 release): per-expert `experts.{e}.w1.weight` (gate), `w3` (up), `w2`
    (down) <-> the same fused `experts.gate_up_proj` [E, 2I, H] (w1 rows first, then w3) and `experts.down_proj`
    [E, H, I] (transformers 5.24 conversion_mapping "deepseek_v4": w1 | w3 concatenated on dim 1 of [E, I, H])."""

    name = "fuse_experts_w13"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<e>\d+)\.(?P<w>w1|w3|w2)\.weight$")
    NAMES = {"gate": "w1", "up": "w3", "down": "w2"}
    WEIGHTS = ("w1", "w3", "w2")

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        for suffix, names in (("experts.gate_up_proj", ("gate", "up")), ("experts.down_proj", ("down",))):
            if module_key.endswith(suffix):
                prefix = module_key[: -len(suffix)]
                keys = tuple(
                    f"{prefix}experts.{e}.{self.NAMES[n]}.weight" for e in range(tensor.shape[0]) for n in names
                )
                return self.split(Group(module_key, keys, self.name), tensor)
        return None


class StackedGateUp(FuseExperts):
    """Experts stacked per projection, as Step-3.5 / 3.7 store them (`moe.gate_proj.weight` / `moe.up_proj.weight`
    [E, I, H], `moe.down_proj.weight` [E, H, I]; the spec renames them to `experts.gate_proj` / `experts.up_proj` /
    `experts.down_proj`) <-> transformers' `experts.gate_up_proj` [E, 2I, H]: gate and up concatenated on dim 1
    (transformers 5.24 conversion_mapping "step3p7": Concatenate(dim=1)); `experts.down_proj` maps 1:1. The inverse
    writes the stacked shapes back."""

    name = "stacked_gate_up"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<w>gate|up)_proj$")

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        found: dict[str, dict[str, str]] = {}
        rest = []
        for key in keys:
            m = self.pattern.match(key)
            if m:
                found.setdefault(m["p"], {})[m["w"]] = key
            else:
                rest.append(key)
        for prefix, pair in found.items():
            if set(pair) != {"gate", "up"}:
                raise CheckpointError(f"{prefix}experts: stacked gate_proj and up_proj must come together")
        groups = [Group(f"{p}experts.gate_up_proj", (w["gate"], w["up"]), self.name) for p, w in found.items()]
        return groups, rest

    def combine(self, group: Group, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(tensors, dim=1)  # [E, I, H] x 2 -> [E, 2I, H]

    def combine_stream(
        self, group: Group, shape: tuple[int, ...], stream: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
    ) -> torch.Tensor:
        """`combine` into a preallocated [E, 2I, H]: gate into rows [0, I), up into [I, 2I), one at a time."""
        out = torch.empty(shape, dtype=dtype)
        rows = shape[1] // 2
        for key, tensor in stream:
            i = group.ckpt_keys.index(key)
            out[:, i * rows : (i + 1) * rows] = tensor
        return out

    def out_shape(self, group: Group, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        experts, rows, cols = shapes[0]
        return (experts, 2 * rows, cols)

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        if module_key.endswith("experts.gate_up_proj"):
            prefix = module_key[: -len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            return {prefix + "gate_proj": gate, prefix + "up_proj": up}
        return None


@dataclass(frozen=True)
class QkvGeometry:
    """A fused qkv_proj pre-sharded in `chunks` row chunks: chunk c holds query heads [c*heads/chunks, ...), then its
    share of the key heads (head_dim rows each), then of the value heads (v_head_dim rows each)."""

    chunks: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int

    def per_chunk(self, key: str = "qkv_proj") -> tuple[int, int, int]:
        """(q, k, v) rows of one chunk; one line when the chunk count does not divide the heads."""
        if self.chunks < 1 or self.heads % self.chunks or self.kv_heads % self.chunks:
            raise CheckpointError(
                f"{key} is pre-sharded at {self.chunks} chunks, which do not divide {self.heads} query / "
                f"{self.kv_heads} key-value heads (num_key_value_heads in config.json?)"
            )
        c = self.chunks
        return self.heads // c * self.head_dim, self.kv_heads // c * self.head_dim, self.kv_heads // c * self.v_head_dim


QKV_FIELDS = ("chunks", "heads", "kv_heads", "head_dim", "v_head_dim")


def qkv_geometry(spec: Any, config: dict[str, Any]) -> QkvGeometry:
    """The fused qkv's geometry from the config fields the spec names (`[block] qkv`); one line for a field that is
    missing or not a positive count."""
    where = spec.path or spec.name
    missing = [f for f in QKV_FIELDS if f not in spec.block.qkv]
    if missing:
        raise SpecError(f"{where}: block.qkv names no config field for {', '.join(missing)}")
    text = spec.text_config(config)
    values = {}
    for name in QKV_FIELDS:
        value = text.get(spec.block.qkv[name])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(
                f"config.json field {spec.block.qkv[name]} is {value!r}: the fused qkv_proj's {name} must be a "
                "positive count"
            )
        values[name] = value
    return QkvGeometry(**values)


def deinterleave_qkv(fused: torch.Tensor, g: QkvGeometry, key: str = "qkv_proj") -> tuple[torch.Tensor, ...]:
    """[chunks * (q + k + v), H] -> (q [heads * d, H], k [kv_heads * d, H], v [kv_heads * dv, H]), heads in order."""
    q, k, v = g.per_chunk(key)
    if fused.shape[0] != g.chunks * (q + k + v):
        raise CheckpointError(f"{key} has {fused.shape[0]} rows, not {g.chunks} chunks of {q} Q + {k} K + {v} V rows")
    per = fused.reshape(g.chunks, q + k + v, *fused.shape[1:])  # [chunks, q + k + v, H]
    return tuple(per[:, a:b].reshape(-1, *fused.shape[1:]).clone() for a, b in ((0, q), (q, q + k), (q + k, q + k + v)))


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: QkvGeometry) -> torch.Tensor:
    """Inverse of `deinterleave_qkv`: the fused, pre-sharded layout as the release ships it."""
    g.per_chunk()
    parts = [t.reshape(g.chunks, -1, *t.shape[1:]) for t in (q, k, v)]  # [chunks, rows / chunks, H] each
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


class DeinterleaveQkv:
    """Fused `self_attn.qkv_proj.weight` (pre-sharded, see `QkvGeometry`) -> the module's `q_proj` / `k_proj` /
    `v_proj` weights: one group per part, each reading the one fused tensor. The geometry is bound at plan time
    (`bind`) from the module's heads and the config field the spec names for the chunk count."""

    name = "deinterleave_qkv"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)qkv_proj\.weight$")
    PARTS = ("q", "k", "v")

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        groups, rest = [], []
        for key in keys:
            m = self.pattern.match(key)
            if not m:
                rest.append(key)
                continue
            groups += [Group(f"{m['p']}{p}_proj.weight", (key,), self.name) for p in self.PARTS]
        return groups, rest

    def bind(self, group: Group, spec: Any, config: dict[str, Any]) -> Group:
        return Group(group.module_key, group.ckpt_keys, group.transform, qkv_geometry(spec, config))

    def _part(self, group: Group) -> int:
        if not isinstance(group.params, QkvGeometry):
            raise SpecError(f"{group.ckpt_keys[0]}: {self.name} needs the fused qkv's geometry bound")
        return self.PARTS.index(group.module_key.rsplit(".", 2)[-2][0])

    def out_shape(self, group: Group, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        i = self._part(group)
        rows = group.params.per_chunk(group.ckpt_keys[0])[i] * group.params.chunks
        return (rows, *shapes[0][1:])

    def combine(self, group: Group, tensors: list[torch.Tensor]) -> torch.Tensor:
        return deinterleave_qkv(tensors[0], group.params, group.ckpt_keys[0])[self._part(group)]

    def gather(self, state: dict[str, torch.Tensor], spec: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The inverse, on block-relative module tensors: q / k / v weights of one attention -> its fused,
        interleaved `qkv_proj.weight`. Meta tensors (key and shape listings) may come one at a time and give the
        fused shape; real ones must come together."""
        out, parts = {}, {}
        for key, tensor in state.items():
            m = re.match(r"^(?P<p>(?:.*\.)?)(?P<w>[qkv])_proj\.weight$", key)
            if m is None:
                out[key] = tensor
                continue
            parts.setdefault(m["p"], {})[m["w"]] = tensor
        for prefix, got in parts.items():
            g = qkv_geometry(spec, config)
            q, k, v = g.per_chunk(prefix + "qkv_proj.weight")
            any_part = next(iter(got.values()))
            if any_part.is_meta:
                out[f"{prefix}qkv_proj.weight"] = torch.empty(
                    (g.chunks * (q + k + v), *any_part.shape[1:]), dtype=any_part.dtype, device="meta"
                )
            elif set(got) != set(self.PARTS):
                raise CheckpointError(f"{prefix}qkv_proj.weight needs q, k and v together (got {sorted(got)})")
            else:
                out[f"{prefix}qkv_proj.weight"] = interleave_qkv(got["q"], got["k"], got["v"], g)
        return out

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        return {module_key: tensor} if module_key.endswith("qkv_proj.weight") else None


def fp8_row_chunks(spec: Any, config: dict[str, Any], key: str) -> int:
    """The row chunks a checkpoint weight of `spec` is pre-sharded in (its fused qkv's chunk count; 1 otherwise)."""
    if DeinterleaveQkv.name not in spec.block.load or not DeinterleaveQkv.pattern.match(key):
        return 1
    return qkv_geometry(spec, config).chunks


LOAD_TRANSFORMS: dict[str, Any] = {
    t.name: t
    for t in (
        FuseExperts(),
        ExpertsAsStored(),
        FusedExperts3d(),
        FuseUpDownExperts(),
        FuseExpertsW13(),
        StackedGateUp(),
        DeinterleaveQkv(),
    )
}


def group_block_keys(keys: list[str], rename: dict[str, str], load: tuple[str, ...]) -> list[Group]:
    """Block-relative checkpoint keys -> groups keyed by module name (relative to the block)."""
    renamed = {}
    for key in keys:
        new = key
        for old_prefix, new_prefix in rename.items():
            if new.startswith(old_prefix):
                new = new_prefix + new[len(old_prefix) :]
                break
        renamed[new] = key
    groups: list[Group] = []
    rest = list(renamed)
    for name in load:
        made, rest = LOAD_TRANSFORMS[name].group(rest)
        groups += [Group(g.module_key, tuple(renamed[k] for k in g.ckpt_keys), g.transform) for g in made]
    groups += [Group(k, (renamed[k],)) for k in rest]
    return groups


def check_spec_transforms(spec: Any) -> None:
    """Every load transform a spec names exists in the registry (`SpecError` otherwise). Checked here, where the
    registry lives, so that loading specs stays free of torch; `layout` calls it before using a spec's names."""
    where = spec.path or spec.name
    for name in spec.block.load:
        if name not in LOAD_TRANSFORMS:
            raise SpecError(f"{where}: block.load names unknown transform {name!r}; known: {sorted(LOAD_TRANSFORMS)}")
