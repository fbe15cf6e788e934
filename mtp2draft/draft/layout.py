"""Checkpoint <-> module key mapping of an MTP layer: where MTP layer i of a checkpoint lives (`plan_mtp_layer`), how
its tensors map onto the native module's state dict (groups, fused experts, renames, the spec's load transforms), the
inverse mapping back to the family's own key names (`native_to_checkpoint`), and which embedding / lm_head the layer
shares with the target. All of it is driven by the family's spec; `convert` and `export` both use it.

Reads headers to plan and tensor bytes only in `iter_native_tensors`. What this module does not do: write files, or
choose a layer or output format (`conversion.py`, `formats/export.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX
from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.draft.build import native_class, native_draft
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.errors import CheckpointError, NoMtpLayerError, SpecError
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_spec
from mtp2draft.family.transforms import LOAD_TRANSFORMS, Group, check_spec_transforms, group_block_keys
from mtp2draft.settings import HubAccess

# Keys some checkpoints carry that no module needs.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# The routed experts in the native module (transformers' fused layout): gate_up [E, 2I, H], down [E, H, I].
EXPERTS_GATE_UP, EXPERTS_DOWN = "block.mlp.experts.gate_up_proj", "block.mlp.experts.down_proj"


@dataclass
class MtpLayerPlan:
    """Where MTP layer `layer` of a checkpoint lives and how its tensors map onto the native module."""

    spec: Spec
    layer: int
    groups: list[Group]  # module key (relative to the native module) <- checkpoint keys (absolute)
    expected: dict[str, tuple[int, ...]]  # module key -> shape the config implies
    buffers: frozenset[str] = frozenset()  # module keys that are buffers (kept in fp32)
    stored_embed: str | None = None
    stored_head: str | None = None

    @property
    def checkpoint_keys(self) -> list[str]:
        return list(dict.fromkeys(k for g in self.groups for k in g.ckpt_keys))  # a fused qkv feeds three groups


def resolve_layer(ckpt: Checkpoint, spec: Spec, layer: int | None) -> tuple[int, int]:
    """(layer index, number of MTP layers), with clear errors for checkpoints without one."""
    count = spec.num_mtp_layers(ckpt.config)
    if count <= 0:
        raise NoMtpLayerError(
            f"{ckpt.source} has no MTP layer ({spec.config.mtp_count} is "
            f"{spec.text_config(ckpt.config).get(spec.config.mtp_count, 'absent')}): nothing to convert"
        )
    if not any(ckpt.has(spec.key(spec.keys.proj, ckpt.config, i)) for i in range(count)):
        raise NoMtpLayerError(
            f"{ckpt.source} declares {count} MTP layer(s) but its index holds no MTP weights "
            f"(looked for {spec.key(spec.keys.proj, ckpt.config, 0)})"
        )
    layer = 0 if layer is None else layer
    if not 0 <= layer < count:
        raise NoMtpLayerError(
            f"--layer {layer} is out of range: {ckpt.source} has {count} MTP layer(s) (0..{count - 1})"
        )
    return layer, count


def _meta_module(spec: Spec, config: dict[str, Any], layer: int = 0) -> NativeMtpDraft:
    with torch.device("meta"):
        return native_draft(spec, config, layer)


def plan_mtp_layer(ckpt: Checkpoint, spec: Spec, layer: int) -> MtpLayerPlan:
    """Map the checkpoint keys of MTP layer `layer` onto the native module's state dict, checking names and shapes
    against the module the config implies (from headers only: no tensor bytes are read)."""
    check_spec_transforms(spec)
    cfg = ckpt.config
    comp = spec.component_keys(cfg, layer)
    glue = native_class(spec).glue(spec)
    missing = [name for name in glue.values() if name not in comp]
    if missing:
        raise SpecError(f"spec {spec.name} names no key for {', '.join(missing)} (its layer kind needs them)")
    groups = [Group(module_key, (comp[name],)) for module_key, name in glue.items()]
    for g in groups:
        if not ckpt.has(g.ckpt_keys[0]):
            raise CheckpointError(f"MTP layer {layer} is missing {g.ckpt_keys[0]} (spec {spec.name})")
        ckpt.check_readable(g.ckpt_keys[0])
    prefix = spec.key(spec.keys.block, cfg, layer)
    named = set(comp.values())
    block_keys = [
        k[len(prefix) :]
        for k in ckpt.keys_with_prefix(prefix)
        if k not in named and not k.endswith(SCALE_SUFFIX) and not k.endswith(IGNORED_SUFFIXES)
    ]
    for k in block_keys:  # a quantised tensor that cannot be read is named before it looks like a stray block key
        ckpt.check_readable(prefix + k)
    for g in group_block_keys(block_keys, dict(spec.block.rename), spec.block.load):
        g = Group("block." + g.module_key, tuple(prefix + k for k in g.ckpt_keys), g.transform)
        transform = LOAD_TRANSFORMS.get(g.transform)
        if hasattr(transform, "bind"):  # e.g. the fused qkv's geometry, from the config
            g = transform.bind(g, spec, cfg)
            if getattr(g.params, "chunks", 1) > 1:  # FP8 scales may be tiled per pre-sharded chunk
                ckpt.fp8_row_chunks[g.ckpt_keys[0]] = g.params.chunks
        groups.append(g)
    module = _meta_module(spec, cfg, layer)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    buffers = frozenset(k for k, _ in module.named_buffers() if k in expected)
    have = {g.module_key for g in groups}
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected))
    if missing:
        raise CheckpointError(
            f"MTP layer {layer} lacks tensors the {spec.name} block needs: {', '.join(missing[:6])}"
            + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        )
    if unexpected:
        names = [g.ckpt_keys[0] for g in groups if g.module_key in unexpected]
        raise CheckpointError(
            f"MTP layer {layer} has tensors the {spec.name} block does not use: {', '.join(names[:6])} "
            "(wrong spec or config?)"
        )
    for g in groups:
        shapes = [ckpt.shape_of(k) for k in g.ckpt_keys]
        shape = LOAD_TRANSFORMS[g.transform].out_shape(g, shapes) if g.transform else shapes[0]
        want = expected[g.module_key]
        if tuple(shape) != tuple(want):
            raise CheckpointError(
                f"tensor {g.ckpt_keys[0]} has shape {list(shapes[0])} but the config implies "
                f"{list(want) if not g.transform else f'{list(want)} after {g.transform}'}"
            )
    stored_embed = comp.get("embed") if comp.get("embed") and ckpt.has(comp["embed"]) else None
    own = spec.layer.own_head  # the layer's own head is one of its weights, not a copy of the target's
    stored_head = comp.get("head") if comp.get("head") and ckpt.has(comp["head"]) and not own else None
    return MtpLayerPlan(spec, layer, groups, expected, buffers, stored_embed, stored_head)


def iter_native_tensors(
    ckpt: Checkpoint,
    plan: MtpLayerPlan,
    dtype: torch.dtype = torch.float32,
    keep_float32: Collection[str] = (),
    exact: dict[str, bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(module key, tensor) for every tensor of the native module, one group in memory at a time.

    Floating parameters become `dtype`; buffers (e.g. a router's score-correction bias) and the module keys in
    `keep_float32` (tensors the checkpoint stores in fp32) keep fp32. `exact`, when given, receives for each module
    key whether the tensor holds the checkpoint's values unrounded: compared value by value with the fp32 read, or,
    for groups streamed expert by expert, by dtype (a narrower dtype than a stored one, or a dequantised one, is
    not counted exact)."""
    for g in plan.groups:
        want = torch.float32 if g.module_key in plan.buffers or g.module_key in keep_float32 else dtype
        transform = LOAD_TRANSFORMS[g.transform] if g.transform else None
        if transform is not None and hasattr(transform, "combine_stream"):
            # e.g. fused experts: filled expert by expert into the output, never all in fp32 at once
            shape = plan.expected[g.module_key]
            tensor = transform.combine_stream(g, shape, ckpt.iter_weights(g.ckpt_keys, torch.float32), want)
            if exact is not None:
                stored = {ckpt.weight_dtype(k) for k in g.ckpt_keys}
                plain = not any(ckpt.scale_key(k) or ckpt.scheme_of(k) for k in g.ckpt_keys)
                exact[g.module_key] = plain and (want == torch.float32 or stored == {want})
        else:
            raw = ckpt.read_weights(g.ckpt_keys, dtype=torch.float32)
            tensors = [raw[k] for k in g.ckpt_keys]
            tensor = transform.combine(g, tensors) if transform is not None else tensors[0]
            del raw, tensors
            if tensor.is_floating_point():
                cast = tensor.to(want)
                if exact is not None:
                    exact[g.module_key] = cast.dtype == tensor.dtype or torch.equal(cast.to(tensor.dtype), tensor)
                tensor = cast
            elif exact is not None:
                exact[g.module_key] = True
        yield g.module_key, tensor
        del tensor  # before the next group is built: one group in memory at a time


def expert_keys(plan: MtpLayerPlan, e: int) -> tuple[str, str, str] | None:
    """Checkpoint keys (gate, up, down) of routed expert `e` when the checkpoint stores experts one by one, as the
    spec's load transform grouped them; None when it stores them fused (3-D) or the block has no routed experts."""
    groups = {g.module_key: g for g in plan.groups}
    gate_up, down = groups.get(EXPERTS_GATE_UP), groups.get(EXPERTS_DOWN)
    if gate_up is None or down is None or not gate_up.transform or not down.transform:
        return None
    transform = LOAD_TRANSFORMS[gate_up.transform]
    gate, up = transform.expert_keys(gate_up, e)
    (down_key,) = LOAD_TRANSFORMS[down.transform].expert_keys(down, e)
    return gate, up, down_key


def native_to_checkpoint(
    spec: Spec,
    config: dict[str, Any],
    layer: int,
    state: dict[str, torch.Tensor],
    stored: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """Native module tensors -> checkpoint tensors under the family's real key names (the inverse of the plan).

    Used to write MTP layers into tiny hub-layout checkpoints and to stitch a fine-tuned layer back. stored: whether
    the checkpoint written over holds a key; a transform that reads the layout as stored (`reads_stored`, e.g. fused
    or per-expert experts) writes the one it finds there. None: each transform's default layout."""
    check_spec_transforms(spec)
    comp = spec.component_keys(config, layer)
    named = native_class(spec).glue(spec)
    prefix = spec.key(spec.keys.block, config, layer)
    inverse_rename = {new: old for old, new in spec.block.rename.items()}

    def original(rel: str) -> str:  # a block-relative module-side key under the checkpoint's own name
        for new, old in inverse_rename.items():
            if rel.startswith(new):
                return old + rel[len(new) :]
        return rel

    def has(rel: str) -> bool:
        return stored is not None and stored(prefix + original(rel))

    out: dict[str, torch.Tensor] = {}
    block: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in named:
            out[comp[named[key]]] = tensor
            continue
        if not key.startswith("block."):
            raise CheckpointError(f"{key} is not a tensor of the native MTP module")
        block[key[len("block.") :]] = tensor
    for name in reversed(spec.block.load):  # transforms whose inverse needs several module tensors at once
        if hasattr(LOAD_TRANSFORMS[name], "gather"):
            block = LOAD_TRANSFORMS[name].gather(block, spec, config)
    for rel_key, tensor in block.items():
        parts = {rel_key: tensor}
        for name in reversed(spec.block.load):
            transform, split = LOAD_TRANSFORMS[name], {}
            for rel, t in parts.items():
                if stored is not None and getattr(transform, "reads_stored", False):
                    mapped = transform.to_checkpoint(rel, t, has)
                else:
                    mapped = transform.to_checkpoint(rel, t)
                split.update(mapped if mapped is not None else {rel: t})
            parts = split
        for rel, t in parts.items():
            out[prefix + original(rel)] = t
    return out


def target_embed_key(ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan) -> str:
    """The embedding the MTP layer shares: the target's, else its copy inside the layer."""
    key = spec.key(spec.keys.target_embed, ckpt.config, plan.layer)
    found = key if ckpt.has(key) else plan.stored_embed
    if not found:
        raise CheckpointError(f"the checkpoint has no embedding ({key})")
    return found


def target_head_key(ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan) -> str:
    """The lm_head the MTP layer shares: the target's, its copy inside the layer, or the embedding when tied."""
    key = spec.key(spec.keys.target_head, ckpt.config, plan.layer)
    return key if ckpt.has(key) else plan.stored_head or target_embed_key(ckpt, spec, plan)


def load_native(
    source: str | Checkpoint,
    layer: int | None = None,
    *,
    hub: HubAccess | None = None,
    attach_target: bool = True,
    dtype: torch.dtype = torch.float32,
    parts: tuple[str, ...] | None = None,
) -> NativeMtpDraft:
    """The native MTP module straight from a checkpoint (in memory; `convert --to mtp` writes the same weights).

    parts: module-name prefixes to materialise and read (e.g. ("enorm", "hnorm", "eh_proj", "block.input_layernorm",
    "block.self_attn")); the rest of the module stays on the meta device and its bytes are never fetched. hub: a Hub
    SOURCE's revision and the token that reaches it."""
    hub = hub or HubAccess()
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source, hub.revision, hub.token)
    spec = find_spec(ckpt.config)
    layer, _ = resolve_layer(ckpt, spec, layer)
    plan = plan_mtp_layer(ckpt, spec, layer)
    if parts is None:
        module = native_draft(spec, ckpt.config, layer)
    else:
        with torch.device("meta"):
            module = native_draft(spec, ckpt.config, layer)
        if spec.block.rotary:  # buffers computed, not loaded
            module.rotary_emb = spec.import_class(spec.block.rotary)(config=module.config)
        for name, sub in module.named_modules():
            if name and name.startswith(parts) and not any(n.startswith(name + ".") for n in parts if n != name):
                sub.to_empty(device="cpu", recurse=True)
        keep = [g for g in plan.groups if g.module_key.startswith(parts)]
        plan = MtpLayerPlan(
            plan.spec, plan.layer, keep, plan.expected, plan.buffers, plan.stored_embed, plan.stored_head
        )
    state = dict(iter_native_tensors(ckpt, plan, dtype=torch.float32))
    module.load_state_dict(state, strict=parts is None)
    if attach_target:
        embed, head = target_embed_key(ckpt, spec, plan), target_head_key(ckpt, spec, plan)
        shared = ckpt.read_weights([embed, head])
        module.attach_target(shared[embed], shared[head])
    return module.to(dtype) if parts is None else module
