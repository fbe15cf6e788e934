"""Stage 1: checkpoint + spec -> draft directory (`--to mtp`, the native layer; `--to eagle3`, SGLang's EAGLE-3).

Reads config.json and the index, selects the MTP layer's tensors by key (never by shard name), fetches only their
bytes, dequantises FP8, and writes group by group, so peak memory follows the largest tensor group. The output
directory appears complete or not at all.

Also `inspect_checkpoint`: what a SOURCE holds and what a conversion would fetch, from config, index and headers only.

What this module does not do: train (`distill.py`), or write engine-specific exports beyond the EAGLE-3 SGLang layout
(`export.py`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .checkpoint import DTYPES as DTYPES_ST
from .checkpoint import SCALE_SUFFIX, Checkpoint, open_checkpoint
from .draft import (
    CONFIG_FILE,
    PROVENANCE_FILE,
    WEIGHTS_FILE,
    NativeMtpDraft,
    block_config,
    native_config,
)
from .errors import CheckpointError, NoMtpLayerError, SourceError
from .io import Progress, SafetensorsWriter, atomic_output_dir, check_output_dir, quiet, write_json
from .spec import Spec, find_spec
from .transforms import EAGLE3_TRANSFORMS, LOAD_TRANSFORMS, Eagle3Build, Group, group_block_keys

DRAFT_KINDS = ("mtp", "eagle3")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
# Keys some checkpoints carry that no module needs.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---- the MTP layer in a checkpoint -----------------------------------------------------------------------------------
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
        return [k for g in self.groups for k in g.ckpt_keys]


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


def _meta_module(spec: Spec, config: dict[str, Any]) -> NativeMtpDraft:
    with torch.device("meta"):
        return NativeMtpDraft(spec, config)


def plan_mtp_layer(ckpt: Checkpoint, spec: Spec, layer: int) -> MtpLayerPlan:
    """Map the checkpoint keys of MTP layer `layer` onto the native module's state dict, checking names and shapes
    against the module the config implies (from headers only: no tensor bytes are read)."""
    cfg = ckpt.config
    comp = spec.component_keys(cfg, layer)
    groups = [
        Group(module_key, (comp[name],))
        for module_key, name in (
            ("enorm.weight", "enorm"),
            ("hnorm.weight", "hnorm"),
            ("eh_proj.weight", "proj"),
            ("final_norm.weight", "final_norm"),
        )
    ]
    for g in groups:
        if not ckpt.has(g.ckpt_keys[0]):
            raise CheckpointError(f"MTP layer {layer} is missing {g.ckpt_keys[0]} (spec {spec.name})")
    prefix = spec.key(spec.keys.block, cfg, layer)
    named = set(comp.values())
    block_keys = [
        k[len(prefix) :]
        for k in ckpt.keys_with_prefix(prefix)
        if k not in named and not k.endswith(SCALE_SUFFIX) and not k.endswith(IGNORED_SUFFIXES)
    ]
    for g in group_block_keys(block_keys, dict(spec.block.rename), spec.block.load):
        groups.append(Group("block." + g.module_key, tuple(prefix + k for k in g.ckpt_keys), g.transform))
    module = _meta_module(spec, cfg)
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
        shapes = [ckpt.info(k).shape for k in g.ckpt_keys]
        shape = LOAD_TRANSFORMS[g.transform].out_shape(g, shapes) if g.transform else shapes[0]
        want = expected[g.module_key]
        if tuple(shape) != tuple(want):
            raise CheckpointError(
                f"tensor {g.ckpt_keys[0]} has shape {list(shapes[0])} but the config implies "
                f"{list(want) if not g.transform else f'{list(want)} after {g.transform}'}"
            )
    stored_embed = comp.get("embed") if comp.get("embed") and ckpt.has(comp["embed"]) else None
    stored_head = comp.get("head") if comp.get("head") and ckpt.has(comp["head"]) else None
    return MtpLayerPlan(spec, layer, groups, expected, buffers, stored_embed, stored_head)


def iter_native_tensors(
    ckpt: Checkpoint, plan: MtpLayerPlan, dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """(module key, tensor) for every tensor of the native module, one group in memory at a time.

    Floating parameters become `dtype`; buffers (e.g. a router's score-correction bias) keep fp32, as the modules and
    the checkpoints keep them."""
    for g in plan.groups:
        want = torch.float32 if g.module_key in plan.buffers else dtype
        transform = LOAD_TRANSFORMS[g.transform] if g.transform else None
        if transform is not None and hasattr(transform, "combine_stream"):
            # e.g. fused experts: filled expert by expert into the output, never all in fp32 at once
            shape = plan.expected[g.module_key]
            tensor = transform.combine_stream(g, shape, ckpt.iter_weights(g.ckpt_keys, torch.float32), want)
        else:
            raw = ckpt.read_weights(g.ckpt_keys, dtype=torch.float32)
            tensors = [raw[k] for k in g.ckpt_keys]
            tensor = transform.combine(g, tensors) if transform is not None else tensors[0]
            del raw, tensors
            if tensor.is_floating_point():
                tensor = tensor.to(want)
        yield g.module_key, tensor
        del tensor  # before the next group is built: one group in memory at a time


def native_to_checkpoint(
    spec: Spec, config: dict[str, Any], layer: int, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Native module tensors -> checkpoint tensors under the family's real key names (the inverse of the plan).

    Used to write MTP layers into tiny hub-layout checkpoints and to stitch a fine-tuned layer back."""
    comp = spec.component_keys(config, layer)
    named = {
        "enorm.weight": "enorm",
        "hnorm.weight": "hnorm",
        "eh_proj.weight": "proj",
        "final_norm.weight": "final_norm",
    }
    prefix = spec.key(spec.keys.block, config, layer)
    inverse_rename = {new: old for old, new in spec.block.rename.items()}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in named:
            out[comp[named[key]]] = tensor
            continue
        if not key.startswith("block."):
            raise CheckpointError(f"{key} is not a tensor of the native MTP module")
        parts = {key[len("block.") :]: tensor}
        for name in reversed(spec.block.load):
            split = {}
            for rel, t in parts.items():
                mapped = LOAD_TRANSFORMS[name].to_checkpoint(rel, t)
                split.update(mapped if mapped is not None else {rel: t})
            parts = split
        for rel, t in parts.items():
            for new, old in inverse_rename.items():
                if rel.startswith(new):
                    rel = old + rel[len(new) :]
                    break
            out[prefix + rel] = t
    return out


def target_embed_key(ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan) -> str:
    key = spec.key(spec.keys.target_embed, ckpt.config, plan.layer)
    if ckpt.has(key):
        return key
    if plan.stored_embed:
        return plan.stored_embed
    raise CheckpointError(f"the checkpoint has no embedding ({key})")


def target_head_key(ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan) -> str:
    """The lm_head the MTP layer shares: the target's, its copy inside the layer, or the embedding when tied."""
    key = spec.key(spec.keys.target_head, ckpt.config, plan.layer)
    if ckpt.has(key):
        return key
    if plan.stored_head:
        return plan.stored_head
    return target_embed_key(ckpt, spec, plan)  # tied embeddings


def load_native(
    source: str | Checkpoint,
    layer: int | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    attach_target: bool = True,
    dtype: torch.dtype = torch.float32,
    parts: tuple[str, ...] | None = None,
) -> NativeMtpDraft:
    """The native MTP module straight from a checkpoint (in memory; `convert --to mtp` writes the same weights).

    parts: module-name prefixes to materialise and read (e.g. ("enorm", "hnorm", "eh_proj", "block.input_layernorm",
    "block.self_attn")); the rest of the module stays on the meta device and its bytes are never fetched."""
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source, revision, token)
    spec = find_spec(ckpt.config)
    layer, _ = resolve_layer(ckpt, spec, layer)
    plan = plan_mtp_layer(ckpt, spec, layer)
    if parts is None:
        module = NativeMtpDraft(spec, ckpt.config, layer)
    else:
        with torch.device("meta"):
            module = NativeMtpDraft(spec, ckpt.config, layer)
        module.rotary_emb = spec.import_class(spec.block.rotary)(config=module.config)  # buffers computed, not loaded
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


# ---- EAGLE-3 --------------------------------------------------------------------------------------------------------
def default_aux_layers(num_layers: int) -> list[int]:
    """Target layers whose outputs EAGLE-3's fc fuses, 0-based 'output of layer i' (SGLang eagle_config ids).

    The high one is the last layer engines can capture (they capture the input of a layer, never the output of the
    final one): the output of layer N-2, the closest to the final hidden state the MTP layer was trained on. The
    mid one is the usual N//2 - 1 and the low one layer 1 (layer 0 when the target is too shallow for distinct ids).
    """
    high = max(num_layers - 2, 0)
    mid = max(min(num_layers // 2 - 1, high - 1), 0)
    low = 1 if mid > 1 else 0
    ids = [low, mid, high]
    if len(set(ids)) < 3 and num_layers >= 3:
        ids = [0, 1, high] if high > 1 else [0, 0, high]
    return ids


def build_eagle3(
    ckpt: Checkpoint, spec: Spec, plan: MtpLayerPlan, aux_layers: list[int] | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """EAGLE-3 config, weights (fp32) and per-tensor provenance, initialised from the MTP layer by the transforms
    the spec names. Experts are read one at a time, and only those the MoE transform keeps."""
    cfg = ckpt.config
    text = spec.text_config(cfg)
    bcfg = block_config(spec, cfg)
    by_module = {g.module_key: g for g in plan.groups}
    cache: dict[str, torch.Tensor] = {}

    def tensor(name: str) -> torch.Tensor:
        if name not in cache:
            g = by_module.get(name)
            if g is None:
                raise CheckpointError(f"the EAGLE-3 transforms need {name}, which this MTP layer does not have")
            raw = ckpt.read_weights(g.ckpt_keys)
            parts = [raw[k] for k in g.ckpt_keys]
            cache[name] = LOAD_TRANSFORMS[g.transform].combine(g, parts) if g.transform else parts[0]
        return cache[name]

    def has(name: str) -> bool:
        return name in by_module

    def expert(e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        prefix = spec.key(spec.keys.block, cfg, plan.layer)
        keys = [f"{prefix}mlp.experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
        if all(ckpt.has(k) for k in keys):
            raw = ckpt.read_weights(keys)
            return raw[keys[0]], raw[keys[1]], raw[keys[2]]
        gate_up, down = tensor("block.mlp.experts.gate_up_proj"), tensor("block.mlp.experts.down_proj")
        g, u = gate_up[e].chunk(2, dim=0)
        return g, u, down[e]

    def head() -> torch.Tensor:
        key = target_head_key(ckpt, spec, plan)
        return ckpt.read_weights([key])[key]

    num_layers = spec.num_layers(cfg)
    aux = list(aux_layers) if aux_layers else default_aux_layers(num_layers)
    if len(aux) != 3 or not all(0 <= i < num_layers - 1 for i in aux):
        raise CheckpointError(f"aux layer ids must be three target layers in 0..{num_layers - 2}, got {aux}")
    b = Eagle3Build(spec, bcfg, text, tensor, has, expert, head, aux)
    b.config.update(hidden_size=int(text["hidden_size"]), hidden_act="silu", vocab_size=int(text["vocab_size"]))
    for name in spec.eagle3.transforms:
        EAGLE3_TRANSFORMS[name](b)
        cache.clear()  # inputs are re-read by the transform that needs them, not kept for the whole build
    config = eagle3_config(b.config, text, aux, cfg)
    # every weight the SGLang layout needs must have been produced by the spec's transforms
    with torch.device("meta"):
        from .draft import Eagle3Draft

        expected = Eagle3Draft(config).state_dict()
    missing = sorted(set(expected) - set(b.out) - {"d2t", "t2d"})
    if missing:
        raise CheckpointError(f"spec {spec.name}: eagle3.transforms leave {', '.join(missing)} uninitialised")
    return config, b.out, b.provenance


def eagle3_config(fields: dict[str, Any], text: dict[str, Any], aux: list[int], target_config: dict[str, Any]):
    """config.json of an EAGLE-3 draft in SGLang's layout, read by vLLM and TensorRT-LLM too.

    Aux ids are written twice: `eagle_config` holds 'output of layer i' ids (SGLang captures before layer i + 1),
    the top-level `eagle_aux_hidden_state_layer_ids` holds vLLM's 'input of layer i' ids, i.e. the same + 1.
    """
    init = fields.pop("mtp2draft_init", None)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": fields["hidden_size"],
        "intermediate_size": fields["intermediate_size"],
        "num_attention_heads": fields["num_attention_heads"],
        "num_key_value_heads": fields["num_key_value_heads"],
        "head_dim": fields["head_dim"],
        "rms_norm_eps": fields.get("rms_norm_eps", float(text.get("rms_norm_eps", 1e-6))),
        "rope_theta": fields["rope_theta"],
        "rope_scaling": fields.get("rope_scaling"),
        "max_position_embeddings": fields["max_position_embeddings"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": fields["vocab_size"],
        "draft_vocab_size": fields.get("draft_vocab_size", fields["vocab_size"]),
        "target_hidden_size": int(text["hidden_size"]),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in aux],
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in text or key in target_config:
            cfg[key] = text.get(key, target_config.get(key))
    if init is not None:
        cfg["mtp2draft_init"] = init
    return cfg


# ---- the stage --------------------------------------------------------------------------------------------------------
@dataclass
class ConvertResult:
    out: Path
    kind: str
    spec: str
    layer: int
    num_mtp_layers: int
    bytes_fetched: int
    bytes_needed: int
    checkpoint_bytes: int
    seconds: float
    provenance: dict[str, Any] = field(default_factory=dict)


def convert(
    source: str,
    out: str | Path,
    to: str = "mtp",
    layer: int | None = None,
    dtype: str = "bfloat16",
    revision: str | None = None,
    token: str | bool | None = None,
    overwrite: bool = False,
    aux_layers: list[int] | None = None,
    progress: Progress = quiet,
) -> ConvertResult:
    """Convert MTP layer `layer` of SOURCE into a draft directory `out` (`to`: mtp or eagle3)."""
    if to not in DRAFT_KINDS:
        raise SourceError(f"--to must be one of {', '.join(DRAFT_KINDS)}, got {to!r}")
    if dtype not in DTYPES:
        raise SourceError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check_output_dir(out, overwrite)
    started = time.perf_counter()
    progress(f"resolving {source}")
    ckpt = open_checkpoint(source, revision, token)
    spec = find_spec(ckpt.config)
    layer, count = resolve_layer(ckpt, spec, layer)
    progress(f"{spec.name}: MTP layer {layer} of {count}; reading shard headers")
    plan = plan_mtp_layer(ckpt, spec, layer)
    torch_dtype = DTYPES[dtype]
    dequantised = [k for k in plan.checkpoint_keys if ckpt.scale_key(k)]
    provenance: dict[str, Any] = {
        "tool": "mtp2draft",
        "version": __version__,
        "command": " ".join(sys.argv) if sys.argv else "",
        "source": ckpt.source,
        "revision": revision,
        "commit": ckpt.commit,
        "spec": spec.name,
        "spec_verified": spec.verified,
        "mtp_layer": layer,
        "draft_kind": to,
        "dtype": dtype,
        "dequantised_fp8": dequantised,
        "fp8_block_size": list(ckpt.fp8_block_size()) if dequantised else None,
    }
    with atomic_output_dir(out, overwrite) as tmp:
        if to == "mtp":
            needed = plan.checkpoint_keys
            _write_native(ckpt, plan, tmp, torch_dtype, progress)
            provenance["tensors"] = {
                g.module_key: {"exact": True, "from": list(g.ckpt_keys), "how": g.transform or "copied"}
                for g in plan.groups
            }
            draft_cfg = native_config(spec, ckpt.config, layer)
            draft_cfg["torch_dtype"] = dtype
        else:
            progress("initialising the EAGLE-3 layer from the MTP layer")
            draft_cfg, weights, tensor_prov = build_eagle3(ckpt, spec, plan, aux_layers)
            draft_cfg["torch_dtype"] = dtype
            from .draft import vocab_maps, without_identity_maps

            d2t, t2d = vocab_maps(torch.arange(draft_cfg["draft_vocab_size"]), draft_cfg["vocab_size"])
            ordered = {k: weights[k].to(torch_dtype) for k in sorted(weights)}
            ordered["d2t"], ordered["t2d"] = d2t, t2d
            ordered = without_identity_maps(ordered, draft_cfg["vocab_size"], draft_cfg["draft_vocab_size"])
            from .io import save_tensors

            save_tensors(tmp / WEIGHTS_FILE, ordered, {"format": "pt"})
            needed = [k for g in plan.groups for k in g.ckpt_keys]  # upper bound; exact bytes below
            provenance["tensors"] = tensor_prov
            provenance["aux_layer_ids"] = draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        draft_cfg["mtp2draft"] = {
            "version": __version__,
            "spec": spec.name,
            "source": ckpt.source,
            "commit": ckpt.commit,
            "mtp_layer": layer,
        }
        write_json(tmp / CONFIG_FILE, draft_cfg)
        provenance["bytes_fetched"] = ckpt.bytes_fetched
        write_json(tmp / PROVENANCE_FILE, provenance)
    seconds = time.perf_counter() - started
    return ConvertResult(
        Path(out),
        to,
        spec.name,
        layer,
        count,
        ckpt.bytes_fetched,
        ckpt.bytes_for(needed) if to == "mtp" else ckpt.bytes_fetched,
        ckpt.total_bytes(),
        seconds,
        provenance,
    )


def _write_native(ckpt: Checkpoint, plan: MtpLayerPlan, out: Path, dtype: torch.dtype, progress: Progress) -> None:
    # dtypes come from the header (integer tensors stay as stored), shapes from the module the config implies
    tensor_plan = []
    for g in plan.groups:
        stored = DTYPES_ST[ckpt.info(g.ckpt_keys[0]).dtype][0]
        want = stored if not stored.is_floating_point else torch.float32 if g.module_key in plan.buffers else dtype
        tensor_plan.append((g.module_key, want, plan.expected[g.module_key]))
    total = len(plan.groups)
    with SafetensorsWriter(out / WEIGHTS_FILE, tensor_plan, {"format": "pt"}) as writer:
        n = 0  # no enumerate(): its cached result tuple would keep the previous group alive during the next
        for key, tensor in iter_native_tensors(ckpt, plan, dtype=dtype):
            writer.write(key, tensor)
            del tensor  # let the group go before the next one is read
            n += 1  # noqa: SIM113 - see the comment above
            if n % 25 == 0 or n == total:
                progress(f"wrote {n}/{total} tensors")


# ---- inspect --------------------------------------------------------------------------------------------------------
def inspect_checkpoint(source: str, revision: str | None = None, token: str | bool | None = None) -> dict[str, Any]:
    """Family, MTP layers and their tensors, and the bytes a conversion fetches vs the whole checkpoint.

    Reads config, index and the headers of the shards holding MTP tensors; no tensor bytes."""
    ckpt = open_checkpoint(source, revision, token)
    spec = find_spec(ckpt.config)
    count = spec.num_mtp_layers(ckpt.config)
    layers = []
    if count > 0:
        resolve_layer(ckpt, spec, 0)
    for layer in range(count):
        plan = plan_mtp_layer(ckpt, spec, layer)
        keys = ckpt.needed_keys(plan.checkpoint_keys)
        tensors = [
            {"name": k, "shape": list(ckpt.info(k).shape), "dtype": ckpt.info(k).dtype, "bytes": ckpt.info(k).nbytes}
            for k in keys
        ]
        params = sum(math.prod(t["shape"]) for t in tensors if not t["name"].endswith(SCALE_SUFFIX))
        layers.append(
            {
                "layer": layer,
                "parameters": params,
                "bytes": sum(t["bytes"] for t in tensors),
                "fp8_weights": sum(1 for k in plan.checkpoint_keys if ckpt.scale_key(k)),
                "stored_embed": plan.stored_embed,
                "stored_head": plan.stored_head,
                "tensors": tensors,
            }
        )
    return {
        "source": ckpt.source,
        "commit": ckpt.commit,
        "spec": spec.name,
        "family": spec.description,
        "block": f"{spec.block.attention} + {spec.block.mlp}",
        "num_mtp_layers": count,
        "layers": layers,
        "convert_bytes": layers[0]["bytes"] if layers else 0,
        "checkpoint_bytes": ckpt.total_bytes(),
        "bytes_read_by_inspect": ckpt.bytes_fetched,
    }
