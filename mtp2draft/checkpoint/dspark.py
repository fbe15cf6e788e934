"""What a checkpoint's DSpark drafter holds, from config.json and the safetensors headers only: its stages under
`mtp.{i}.`, the context projection on the first stage, and the head stack on the last one (norm, hc_head, Markov
head, confidence head). DeepSeek-V4-Flash-0731's layout: three V4 blocks `mtp.0..2`, `mtp.0.main_proj` [hidden,
len(target layers) * hidden], `mtp.2.markov_head.markov_w{1,2}` [vocab, rank], `mtp.2.confidence_head.proj`
[1, hidden + rank] (docs/notes/2026-12-05-dspark-definition.md).

The stage count comes from the tensors. The config's `num_nextn_predict_layers` is reported next to it, but it is
not a count of DSpark stages: V4-0731 says 1 and ships 3.

What this module does not do: read tensor bytes, dequantise, or convert. It inspects; `convert` still refuses.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.errors import CheckpointError
from mtp2draft.family.dspark import DETECT_KEY, DSparkFields
from mtp2draft.kinds import SUPPORTED_SO_FAR

PREFIX = "mtp."
_STAGE = re.compile(r"^mtp\.(\d+)\.")
# the tensors that make stage 0 and the last stage DSpark's, not an MTP layer's (enorm / hnorm / e_proj / h_proj)
FIRST_STAGE = ("main_proj.weight", "main_norm.weight")
LAST_STAGE = (
    "norm.weight",
    "markov_head.markov_w1.weight",
    "markov_head.markov_w2.weight",
    "confidence_head.proj.weight",
)


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


def _check(ckpt: Checkpoint, fields: DSparkFields, stages: dict[int, list[str]]) -> dict[str, int]:
    """The checks that make the `mtp.*` tensors this config's DSpark drafter, or one line saying what is not."""
    declared = f"config.json declares a DSpark drafter ({DETECT_KEY} = {fields.block_size})"
    if not stages:
        raise CheckpointError(f"{declared} but the checkpoint holds no {PREFIX}* tensors")
    if list(stages) != list(range(len(stages))):
        raise CheckpointError(f"{declared} but its {PREFIX}* stages are numbered {list(stages)}, not 0..n-1")
    last = len(stages) - 1
    missing = [f"mtp.0.{n}" for n in FIRST_STAGE if not ckpt.has(f"mtp.0.{n}")]
    missing += [f"mtp.{last}.{n}" for n in LAST_STAGE if not ckpt.has(f"mtp.{last}.{n}")]
    if missing:
        raise CheckpointError(f"{declared} but {PREFIX}* is not one: no {', '.join(missing)}")
    text = _text(ckpt.config)
    hidden, layers = text.get("hidden_size"), text.get("num_hidden_layers")
    fused = ckpt.shape_of("mtp.0.main_proj.weight")
    if isinstance(hidden, int) and tuple(fused) != (hidden, len(fields.target_layer_ids) * hidden):
        raise CheckpointError(
            f"mtp.0.main_proj.weight is {list(fused)}, but {len(fields.target_layer_ids)} target layers "
            f"(dspark_target_layer_ids = {list(fields.target_layer_ids)}) of hidden_size {hidden} make "
            f"[{hidden}, {len(fields.target_layer_ids) * hidden}]"
        )
    if isinstance(layers, int) and max(fields.target_layer_ids) >= layers:
        raise CheckpointError(
            f"dspark_target_layer_ids = {list(fields.target_layer_ids)} names a layer past num_hidden_layers = {layers}"
        )
    rank = ckpt.shape_of(f"mtp.{last}.markov_head.markov_w1.weight")[-1]
    if fields.markov_rank is not None and rank != fields.markov_rank:
        raise CheckpointError(
            f"mtp.{last}.markov_head.markov_w1.weight has rank {rank}, config.json dspark_markov_rank = "
            f"{fields.markov_rank}"
        )
    return {"hidden_size": fused[0], "markov_rank": rank}


def inspect_dspark(ckpt: Checkpoint, fields: DSparkFields) -> dict[str, Any]:
    """The DSpark drafter of an opened checkpoint: settings, stages with their tensor counts, parameters and stored
    bytes, and the tensors outside the decoder blocks (the projection and the head stack). CheckpointError when the
    `mtp.*` tensors are not the drafter the config declares."""
    stages = _stages(ckpt)
    shape = _check(ckpt, fields, stages)
    rows, heads = [], []
    for stage, keys in stages.items():
        schemes = Counter(s.name for s in map(ckpt.scheme_of, keys) if s is not None)
        rows.append(
            {
                "stage": stage,
                "tensors": len(ckpt.needed_keys(keys)),  # stored tensors, scales included (as release counts)
                "parameters": sum(math.prod(ckpt.shape_of(k)) for k in keys),
                "bytes": ckpt.bytes_for(keys),
                "fp8_weights": sum(1 for k in keys if ckpt.scale_key(k)),
                "quantised_weights": dict(sorted(schemes.items())),
            }
        )
        for key in keys:
            rest = key[len(f"mtp.{stage}.") :]
            if rest in FIRST_STAGE + LAST_STAGE or rest.startswith("hc_head_"):
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
