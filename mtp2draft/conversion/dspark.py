"""`convert` of a DSpark drafter: its `mtp.*` stages as a dspark draft directory. FP8 and FP4 weights are
dequantised the way the MTP path does it (`checkpoint.reader`), tensors stored as float32 stay float32, and the
others are cast to `--dtype`. The release's names are kept (`mtp.{i}.attn.wq_a.weight`, ...), and config.json names
the layout they follow (`layout`: a file of model_specs/dspark/, whose tables map each head role to its stored name:
V4.1's `markov_head.embed` is V4-0731's `markov_head.markov_w1`).

The directory holds config.json (`draft_kind: dspark`, the `dspark_*` settings, the stage count and the target's
config), model.safetensors and provenance.json. The drafter shares the target's embedding and head (vLLM's DSpark
proposer shares them), so neither is copied.

What this module does not do: build or run the drafter (`draft.dspark`), or write the release's quantisation back.
`distill` and `export` refuse a dspark directory (`kinds.detect_kind`); `evaluate` runs it (`evaluation.dspark`) once
its stage exists (`draft.dspark_disk.open_dspark`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.checkpoint.dspark import inspect_dspark
from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.errors import OptionError
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.kinds import CONFIG_FILE, DSPARK_KIND, PROVENANCE_FILE, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.outputs.writer import SafetensorsWriter
from mtp2draft.redact import command_line
from mtp2draft.settings import ConvertConfig


def check_dspark_options(config: ConvertConfig) -> None:
    """The convert options that make drafts from an MTP layer do not apply to a DSpark drafter."""
    asked = [f"--to {config.to}"] if config.to else []
    asked += ["--layer"] if config.layer is not None else []
    asked += ["--all-layers"] if config.all_layers else []
    asked += ["--aux-layers"] if config.aux_layers else []
    if asked:
        raise OptionError(
            f"{', '.join(asked)}: this checkpoint's mtp.* tensors are a DSpark block drafter, not an MTP layer; "
            "convert writes all its stages as one dspark draft directory (give none of --to / --layer / "
            "--all-layers / --aux-layers)"
        )


def convert_dspark(
    ckpt: Checkpoint,
    fields: DSparkFields,
    out: str | Path,
    config: ConvertConfig,
    *,
    source: str,
    revision: str | None,
    overwrite: bool,
    progress: Any,
) -> dict[str, Any]:
    """Write the DSpark drafter of `ckpt` into `out`. Returns what `conversion.convert` reports: the inspect
    summary plus `seconds`, `bytes_fetched` and the provenance."""
    check_dspark_options(config)
    started = time.perf_counter()
    info = inspect_dspark(ckpt, fields)  # refuses tensors that are not the declared drafter before anything is read
    keys = [k for k in ckpt.keys_with_prefix("mtp.")]
    stored_f32 = [k for k in keys if k in ckpt.weight_map and ckpt.info(k).dtype == "F32"]
    dtype_name = config.draft_dtype  # stored fp32 tensors stay fp32 whatever is named (the mixers need it)
    target = TORCH_DTYPES[dtype_name]

    def dtype_of(key: str) -> torch.dtype:
        if key in stored_f32 or not ckpt.weight_dtype(key).is_floating_point:
            return ckpt.weight_dtype(key)
        return target

    plan = [(k, dtype_of(k), tuple(ckpt.shape_of(k))) for k in keys]
    dequantised: dict[str, list[str]] = {}
    for key in keys:
        scheme = ckpt.scheme_of(key)
        if scheme is not None:
            dequantised.setdefault(scheme.name, []).append(key)
        elif ckpt.scale_key(key):
            dequantised.setdefault("fp8_block", []).append(key)
    progress(f"DSpark drafter: {info['num_stages']} stages, {len(keys)} tensors")
    with atomic_output_dir(out, overwrite, inputs=[source]) as tmp:
        with SafetensorsWriter(tmp / WEIGHTS_FILE, plan, metadata={"format": "pt"}) as writer:
            got = dict(ckpt.iter_weights(keys, dtype=torch.float32))
            for key, dtype, _ in plan:
                writer.write(key, got.pop(key).to(dtype))
        write_json(
            tmp / CONFIG_FILE,
            {
                "draft_kind": DSPARK_KIND,
                "architectures": ckpt.config.get("architectures"),
                "dspark": fields.summary(),
                "layout": info["layout"],  # model_specs/dspark/<layout>.toml: role -> stored name
                "num_stages": info["num_stages"],
                "experts_per_stage": info["dspark"]["experts_per_stage"],
                "torch_dtype": dtype_name,
                "target_config": dict(ckpt.config),
                "mtp2draft": {"version": __version__, "source": ckpt.source, "commit": ckpt.commit},
            },
        )
        provenance = {
            "tool": "mtp2draft",
            "version": __version__,
            "command": command_line(),
            "source": str(source),
            "revision": revision,
            "commit": ckpt.commit,
            "draft_kind": DSPARK_KIND,
            "dtype": config.dtype,
            "dequantised": dequantised,  # scheme -> keys; fp8_block: FP8 weights with a block scale
            "stored_float32": stored_f32,
            "shares_target": ["embedding", "head"],
            "bytes_fetched": ckpt.bytes_fetched,
        }
        write_json(tmp / PROVENANCE_FILE, provenance)
    return {**info, "seconds": time.perf_counter() - started, "provenance": provenance}
