"""What a checkpoint's DSpark drafter holds, from config.json and the safetensors headers only: its stages under
`mtp.{i}.`, the context projection on the first stage, the head stack on the last one, and each stage's routed
experts. The names come from the release's layout (`family.dspark.layout_for`, model_specs/dspark/):
DeepSeek-V4-Flash-0731 ends in `markov_head.markov_w{1,2}` and `hc_head_*`, DeepSeek-V4.1 in
`markov_head.{embed,head}` with no `hc_head` (vLLM 0.32 (CPU build) vllm/models/deepseek_v41/nvidia/dspark.py,
`_remap_dspark_name`). Shapes: `mtp.0.main_proj` [hidden, len(target layers) * hidden], the Markov factors
[vocab, rank], the confidence head [1, hidden + rank] (docs/notes/2026-12-05-dspark-definition.md).

The stage count comes from the tensors. The config's `num_nextn_predict_layers` is reported next to it, but it is
not a count of DSpark stages: V4-0731 says 1 and ships 3. A stage's expert count is checked against the config keys
the layout names (V4.1's stages hold `dspark_n_routed_experts`, not the trunk's `n_routed_experts`).

What this module does not do: read tensor bytes, dequantise, or convert (`conversion.dspark`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.errors import CheckpointError
from mtp2draft.family.dspark import DETECT_KEY, DSparkFields, DSparkLayout, layout_for
from mtp2draft.kinds import SUPPORTED_SO_FAR

PREFIX = "mtp."
_STAGE = re.compile(r"^mtp\.(\d+)\.")
_EXPERT = re.compile(r"\.ffn\.experts\.(\d+)\.")


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _stages(ckpt: Checkpoint) -> dict[int, list[str]]:
    stages: dict[int, list[str]] = {}
    for key in ckpt.keys_with_prefix(PREFIX):
        found = _STAGE.match(key)
        if found:
            stages.setdefault(int(found.group(1)), []).append(key)
    return dict(sorted(stages.items()))


def _experts(keys: list[str]) -> set[int]:
    return {int(m.group(1)) for k in keys if (m := _EXPERT.search(k))}


def _check(
    ckpt: Checkpoint, fields: DSparkFields, layout: DSparkLayout, stages: dict[int, list[str]]
) -> dict[str, Any]:
    """The checks that make the `mtp.*` tensors this config's DSpark drafter, or one line saying what is not."""
    declared = f"config.json declares a DSpark drafter ({DETECT_KEY} = {fields.block_size})"
    if not stages:
        raise CheckpointError(f"{declared} but the checkpoint holds no {PREFIX}* tensors")
    if list(stages) != list(range(len(stages))):
        raise CheckpointError(f"{declared} but its {PREFIX}* stages are numbered {list(stages)}, not 0..n-1")
    last = len(stages) - 1
    first_key = {role: f"mtp.0.{name}" for role, name in layout.first.items()}
    last_key = {role: f"mtp.{last}.{name}" for role, name in layout.last.items()}
    missing = [k for k in [*first_key.values(), *last_key.values()] if not ckpt.has(k)]
    if missing:
        raise CheckpointError(
            f"{declared} but {PREFIX}* is not one: no {', '.join(missing)} (the {layout.name} layout, "
            f"model_specs/dspark/{layout.name}.toml)"
        )
    text = _text(ckpt.config)
    hidden, layers = text.get("hidden_size"), text.get("num_hidden_layers")
    fused = ckpt.shape_of(first_key["main_proj"])
    if isinstance(hidden, int) and tuple(fused) != (hidden, len(fields.target_layer_ids) * hidden):
        raise CheckpointError(
            f"{first_key['main_proj']} is {list(fused)}, but {len(fields.target_layer_ids)} target layers "
            f"(dspark_target_layer_ids = {list(fields.target_layer_ids)}) of hidden_size {hidden} make "
            f"[{hidden}, {len(fields.target_layer_ids) * hidden}]"
        )
    if isinstance(layers, int) and max(fields.target_layer_ids) >= layers:
        raise CheckpointError(
            f"dspark_target_layer_ids = {list(fields.target_layer_ids)} names a layer past num_hidden_layers = {layers}"
        )
    rank = ckpt.shape_of(last_key["markov_w1"])[-1]
    if fields.markov_rank is not None and rank != fields.markov_rank:
        raise CheckpointError(
            f"{last_key['markov_w1']} has rank {rank}, config.json dspark_markov_rank = {fields.markov_rank}"
        )
    # each stage's routed experts: 0..E-1 with E what the loader reads from the config (V4.1: the drafter's own)
    want = layout.expert_count(text)
    counts = {stage: _experts(keys) for stage, keys in stages.items()}
    for stage, found in counts.items():
        if found and want is not None and found != set(range(want)):
            said = " or ".join(layout.stage_experts)
            raise CheckpointError(
                f"mtp.{stage}.ffn.experts.* holds {len(found)} routed experts (ids {min(found)}..{max(found)}), but "
                f"config.json says {want} "
                f"({said}, as the {layout.name} loader reads it)"
            )
    experts = len(counts[0]) if counts[0] else None
    return {"hidden_size": fused[0], "markov_rank": rank, "experts_per_stage": experts}


def inspect_dspark(ckpt: Checkpoint, fields: DSparkFields) -> dict[str, Any]:
    """The DSpark drafter of an opened checkpoint: settings, its layout, stages with their tensor counts, parameters
    and stored bytes, and the tensors outside the decoder blocks (the projection and the head stack). CheckpointError
    when the `mtp.*` tensors are not the drafter the config declares."""
    layout = layout_for(ckpt.config)
    stages = _stages(ckpt)
    shape = _check(ckpt, fields, layout, stages)
    last = len(stages) - 1
    outside = {f"mtp.0.{n}" for n in layout.first.values()} | {f"mtp.{last}.{n}" for n in layout.last.values()}
    rows, heads = [], []
    for stage, keys in stages.items():
        schemes = Counter(s.name for s in map(ckpt.scheme_of, keys) if s is not None)
        rows.append(
            {
                "stage": stage,
                "tensors": len(ckpt.needed_keys(keys)),  # stored tensors, scales included (as release counts)
                "parameters": sum(math.prod(ckpt.shape_of(k)) for k in keys),
                "bytes": ckpt.bytes_for(keys),
                "routed_experts": len(_experts(keys)),
                "fp8_weights": sum(1 for k in keys if ckpt.scale_key(k)),
                "quantised_weights": dict(sorted(schemes.items())),
            }
        )
        for key in keys:
            if key in outside:
                info = ckpt.info(key) if key in ckpt.weight_map else None
                heads.append(
                    {"name": key, "shape": list(ckpt.shape_of(key)), "dtype": info.dtype if info else "quantised"}
                )
    text = _text(ckpt.config)
    return {
        "draft_kind": "dspark",
        "source": ckpt.source,
        "commit": ckpt.commit,
        "model_type": text.get("model_type", ckpt.config.get("model_type")),
        "architectures": ckpt.config.get("architectures"),
        "layout": layout.name,
        "dspark": {**fields.summary(), "found_in": fields.section, **shape},
        "num_stages": len(stages),
        "num_nextn_predict_layers": text.get("num_nextn_predict_layers"),  # as the config says; not the stage count
        "stages": rows,
        "head_tensors": heads,
        "drafter_bytes": sum(r["bytes"] for r in rows),
        "checkpoint_bytes": ckpt.total_bytes(),
        "bytes_read_by_inspect": ckpt.bytes_fetched,
        "supported": SUPPORTED_SO_FAR,
    }
