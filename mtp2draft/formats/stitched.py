"""The `stitched` format (native MTP): the fine-tuned layer written back under the target's key names, dtypes and
quantization, as an overlay: only the shards holding MTP keys (their other tensors unchanged), the index, the
target's config.json and a README saying how to lay the files over the target (vLLM's `method: "mtp"` then loads it).

What this module does not do: write the NextN layout (`nextn.py`) or publish (`hub.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX, fp8_block_size
from mtp2draft.checkpoint.reader import INDEX_FILE, ST_DTYPES, Checkpoint
from mtp2draft.draft.layout import plan_mtp_layer
from mtp2draft.errors import DraftError
from mtp2draft.family.spec import Spec, find_spec
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats.common import README_FILE, finite_file, fp8_problems, read_headers, read_json, sglang_steps
from mtp2draft.formats.native import (
    COPY_RUN_BYTES,
    ChainLayers,
    NativeLayer,
    NativeWriter,
    computation_record,
    contiguous_runs,
    draft_layers,
    engine_mismatches,
    fp8_block,
    meta_checkpoint,
    native_input,
    natural_order,
    open_target,
    stored_from_target,
    trunk_keys,
)
from mtp2draft.io import SafetensorsWriter, write_json
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE


def _target_index(ckpt: Checkpoint) -> dict[str, Any]:
    """The target's model.safetensors.index.json as stored (metadata included), or one built from its weight map."""
    raw = None
    try:
        if ckpt.is_local:
            raw = read_json(Path(ckpt.source) / INDEX_FILE)
        elif ckpt.files.exists(INDEX_FILE):
            from huggingface_hub import hf_hub_download

            local = hf_hub_download(
                ckpt.source, INDEX_FILE, revision=ckpt.commit, token=getattr(ckpt.files, "token", None)
            )
            raw = read_json(Path(local))
    except (OSError, DraftError):
        raw = None
    if not raw or not isinstance(raw.get("weight_map"), dict):
        raw = {"metadata": {"total_size": ckpt.total_bytes()}, "weight_map": dict(ckpt.weight_map)}
    return raw


def _export_stitched(job: ExportJob) -> None:
    """The `write` of this format: fills job.out from the draft job.src."""
    src, cfg, tmp, record = job.src, job.cfg, job.out, job.record
    target, revision, token, progress = job.target, job.revision, job.token, job.progress
    if not target:  # the registry marks stitched needs_target, so export asks for it first
        raise DraftError("the stitched format needs --target: the checkpoint the layer is written back over")
    spec, target_config, layer = native_input(src, cfg)
    ckpt = open_target(target, cfg, revision, token)
    layers = draft_layers(src, cfg)  # one, or every layer of a chain draft: each written back where it came from
    parts = [NativeLayer(src / WEIGHTS_FILE, spec, ckpt.config, i, prefix) for prefix, i in layers]
    native = ChainLayers(parts)
    shared: set[str] = set()
    for part in parts:
        foreign = [k for k in part.checkpoint_keys() if not ckpt.has(k)]
        if foreign:
            raise DraftError(f"the draft's {foreign[0]} has no counterpart in --target {target} (+{len(foreign) - 1})")
        plan = plan_mtp_layer(ckpt, spec, part.layer)
        uncovered = sorted(set(plan.checkpoint_keys) - set(part.checkpoint_keys()))
        if uncovered:
            raise DraftError(
                f"the draft lacks {uncovered[0]} of the target's MTP layer {part.layer} (+{len(uncovered) - 1})"
            )
        # A tensor the layer shares with the trunk (ERNIE's final norm is `model.norm`) is the target's, not the
        # layer's: it is never rewritten, and a draft that changed it cannot be stitched without changing the target.
        shared |= trunk_keys(spec, ckpt.config, part.layer) & set(part.checkpoint_keys())
    for key in sorted(shared):
        stored_tensor = ckpt.read_raw([key])[key]
        if not torch.equal(native.get(key).to(stored_tensor.dtype), stored_tensor):
            raise DraftError(
                f"the draft changed {key}, which the MTP layer shares with the trunk: writing it back would change "
                "the target (keep it frozen when fine-tuning)"
            )
    keys = [k for k in native.checkpoint_keys() if k not in shared]
    quantised = [k for k in keys if ckpt.quantised(k)]
    if quantised:  # their parts would need renaming and the config's ignore list extending: not written yet
        raise DraftError(
            f"--target {target} stores {quantised[0]} (+{len(quantised) - 1}) as {ckpt.scheme_of(quantised[0]).name}: "
            "the stitched export writes block FP8 `_scale_inv` or the target's float dtypes only"
        )
    stored = stored_from_target(ckpt, keys)
    writer = NativeWriter(native, stored, ckpt.fp8_block_size(), fp8_block(ckpt.config, {})[1])
    replaced = {name: key for key in keys for name in writer.names(key)}
    shards = sorted({ckpt.weight_map[name] for name in replaced}, key=natural_order)
    for n, file in enumerate(shards, 1):
        progress(f"rewriting shard {file} ({n}/{len(shards)})")
        infos = sorted(ckpt.header(file).values(), key=lambda i: i.start)
        for info in infos:
            if info.name in replaced and tuple(info.shape) != tuple(writer.spec(info.name)[1]):
                raise DraftError(
                    f"the draft's {info.name} would be {list(writer.spec(info.name)[1])}, the target stores "
                    f"{list(info.shape)}"
                )
        layout = [(i.name, ST_DTYPES[i.dtype][0], tuple(i.shape)) for i in infos]
        with SafetensorsWriter(tmp / file, layout, {"format": "pt"}) as out:
            for run in contiguous_runs(infos, COPY_RUN_BYTES):
                kept = ckpt.read_raw([i.name for i in run if i.name not in replaced])
                for info in run:
                    out.write(info.name, writer.get(info.name) if info.name in replaced else kept[info.name])
    write_json(tmp / INDEX_FILE, _target_index(ckpt))
    write_json(tmp / CONFIG_FILE, ckpt.config)
    written = [i for _, i in layers]
    (tmp / README_FILE).write_text(_stitched_readme(ckpt, spec, written, shards, writer.requantised))
    for note in engine_mismatches(spec, cfg, ("vllm", "sglang")):
        progress("note: " + note)
    record.update(
        target=ckpt.source,
        target_commit=ckpt.commit,
        mtp_layer=layer,
        mtp_layers=written,
        **({"step_layers": cfg.get("step_layers", "cycle")} if len(written) > 1 else {}),
        spec=spec.name,
        **computation_record(spec, cfg),
        overlay_files=[*shards, INDEX_FILE],
        requantised_fp8=sorted(writer.requantised),
    )


def _stitched_readme(ckpt: Checkpoint, spec: Spec, layers: list[int], shards: list[str], requantised: list[str]) -> str:
    where = ckpt.source + (f" (commit {ckpt.commit})" if ckpt.commit else "")
    quant = (
        f"{len(requantised)} FP8 weights were requantised per {ckpt.fp8_block_size()[0]}x{ckpt.fp8_block_size()[1]} "
        "block with fresh `_scale_inv`; every other tensor keeps the target's dtype."
        if requantised
        else "Every tensor keeps the target's dtype."
    )
    files = "\n".join(f"- `{f}`" for f in [*shards, INDEX_FILE])
    revision = f" --revision {ckpt.commit}" if ckpt.commit else ""
    fetch = (
        f"cp -r {ckpt.source} ./target-stitched"
        if ckpt.is_local
        else f"hf download {ckpt.source}{revision} --local-dir ./target-stitched"
    )
    which = f"MTP layer {layers[0]}" if len(layers) == 1 else f"MTP layers {', '.join(map(str, layers))}"
    return f"""# Stitched MTP layer ({spec.name})

The fine-tuned {which} of `{where}`, written back under the checkpoint's own key names, dtypes and
quantization by mtp2draft {__version__}. {quant}

This directory is an overlay, not a whole checkpoint: it holds only the shards that contain MTP tensors (their
other tensors are the target's, unchanged) and the index.

{files}

`config.json` is the target's, unchanged.

## Overlay it onto the target

```bash
{fetch}
cp {" ".join(shards)} {INDEX_FILE} ./target-stitched/
```

## Serve

```bash
vllm serve ./target-stitched --speculative-config '{{"method": "mtp", "num_speculative_tokens": 3}}'
python -m sglang.launch_server --model ./target-stitched --speculative-algorithm EAGLE \\
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
```
"""


def _validate_stitched(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    try:
        spec = find_spec(cfg)
    except Exception as exc:
        return [f"config.json matches no spec ({exc})"]
    count = spec.num_mtp_layers(cfg)
    if count <= 0:
        return [f"config.json declares no MTP layer ({spec.config.mtp_count})"]
    index = read_json(path / INDEX_FILE)
    weight_map = index.get("weight_map") if index else None
    if not isinstance(weight_map, dict):
        return [f"{INDEX_FILE} is missing or has no weight_map"]
    present = {p.name for p in path.glob("*.safetensors")}
    for file in sorted(present - set(weight_map.values())):
        problems.append(f"{file} is in the overlay but the index maps no tensor to it")
    prefixes = [spec.key(spec.keys.block, cfg, i) for i in range(count)]
    trunk = {k for i in range(count) for k in trunk_keys(spec, cfg, i)}
    named = {k for i in range(count) for k in spec.component_keys(cfg, i).values()} - trunk
    mtp_keys = [k for k in weight_map if k in named or k.startswith(tuple(prefixes))]
    if not mtp_keys:
        problems.append("the index maps no MTP tensor")
    for key in mtp_keys:
        if weight_map[key] not in present:
            problems.append(f"the index maps MTP tensor {key} to {weight_map[key]}, which is missing from the overlay")
    block = fp8_block_size(cfg)
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(count):
        try:
            shapes, _ = meta_checkpoint(spec, cfg, cfg, i)
        except Exception as exc:
            problems.append(f"cannot build the {spec.name} MTP block from config.json: {exc}")
            break
        expected.update(shapes)
    for key in sorted(set(expected) - set(weight_map), key=natural_order):
        problems.append(f"the index lacks MTP tensor {key}")
    for file in sorted(present & set(weight_map.values())):
        try:
            headers = read_headers(path / file)
        except Exception as exc:
            problems.append(f"{file} cannot be read: {exc}")
            continue
        mapped = {k for k, f in weight_map.items() if f == file}
        for key in sorted(mapped - set(headers), key=natural_order):
            problems.append(f"the index maps {key} to {file}, which does not hold it")
        for key in sorted(set(headers) - mapped, key=natural_order):
            problems.append(f"{file} holds {key}, which the index maps elsewhere")
        for key in sorted(set(headers) & set(expected), key=natural_order):
            if list(headers[key][1]) != list(expected[key]):
                problems.append(f"{key} has shape {headers[key][1]}, the config implies {list(expected[key])}")
            else:
                problems += fp8_problems(key, headers[key][0], expected[key], headers, block)
        mtp_here = [
            k for k in headers if k in expected or (k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] in expected)
        ]
        problems += finite_file(path / file, mtp_here)
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
def _is_stitched(config: Mapping[str, Any]) -> bool:
    """A target config.json (of a family a spec knows): the overlay carries the target's own config."""
    try:
        find_spec(config)
    except Exception:
        return False
    return True


def _launch_lines(target: str, draft: str, k: int) -> dict[str, str]:
    return {
        "overlay": f"hf download {target} --local-dir ./target-stitched && hf download {draft} --include "
        "'*.safetensors' 'model.safetensors.index.json' --local-dir ./target-stitched",
        "vLLM": "vllm serve ./target-stitched --speculative-config "
        f'\'{{"method": "mtp", "num_speculative_tokens": {k}}}\'',
        "SGLang": f"python -m sglang.launch_server --model ./target-stitched --speculative-algorithm EAGLE "
        f"{sglang_steps(k)}",
    }


def _usable(spec: Spec) -> bool:
    """Any family with an MTP layer: the layer goes back where it came from."""
    return True


# Format(write, validate, detect, launch_lines, usable, codec): see formats/__init__.py
PROVIDES: dict[str, Format] = {
    "stitched": Format(_export_stitched, _validate_stitched, _is_stitched, _launch_lines, _usable)
}
