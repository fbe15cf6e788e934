"""The `stitched` format (native MTP): the fine-tuned layer written back under the target's key names, dtypes and
quantization, as an overlay: only the shards holding MTP keys (their other tensors unchanged), the index, the
target's config.json and a README saying how to lay the files over the target (vLLM's `method: "mtp"` then loads it).
A quantised target's layer is written in its own scheme where `formats/requant.py` can write it (DeepSeek-V4's FP8 /
FP4 with e8m0 scales), else (ModelOpt, compressed-tensors) in the float dtype with the layer's quantised parts dropped
from the shard and the index and its prefix added to the config's exclusion list.

What this module does not do: write the NextN layout (`nextn.py`) or publish (`hub/upload.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX, fp8_block_size
from mtp2draft.checkpoint.reader import INDEX_FILE, open_checkpoint
from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.draft.layout import plan_mtp_layer
from mtp2draft.dtypes import ST_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_spec
from mtp2draft.family.transforms import fp8_row_chunks
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats.common import (
    README_FILE,
    STITCHED_MARK,
    finite_file,
    fp8_problems,
    quantised_problems,
    read_headers,
    read_json,
    sglang_steps,
)
from mtp2draft.formats.graft import graft, graft_readme, identity_view, needs_graft
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
    stored_from_target,
    trunk_keys,
)
from mtp2draft.formats.requant import UNQUANTISED_WHY, excluded_config
from mtp2draft.formats.serving import config_view_note, launch_lines, local_ref, serving_text
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import SafetensorsWriter
from mtp2draft.redact import redact
from mtp2draft.target.release import diagnose, unexcluded


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


def _write(job: ExportJob) -> None:
    """A native MTP draft job.src written back over the target into job.out."""
    src, cfg, tmp, record = job.src, job.cfg, job.out, job.record
    target, revision, token, progress = job.target, job.hub.revision, job.hub.token, job.progress
    if not target:  # the registry marks stitched needs_target, so export asks for it first
        raise DraftError("the stitched format needs --target: the checkpoint the layer is written back over")
    from mtp2draft.draft.config import parse_draft_config
    from mtp2draft.target.identity import check_target_identity

    spec, target_config, layer = native_input(src, cfg)
    ckpt = open_checkpoint(target, revision, token)
    layers = draft_layers(src, cfg)  # one, or every layer of a chain draft: each written back where it came from
    # each layer written back in the layout the target stores it in (e.g. its experts fused or one by one)
    parts = [NativeLayer(src / WEIGHTS_FILE, spec, ckpt.config, i, prefix, ckpt.has) for prefix, i in layers]
    grafting = needs_graft(ckpt, parts)  # a release without the layer: it is grafted (formats/graft.py)
    # the draft's trunk must be the release's; a graft sets the count field, so the release's may say anything
    seen = identity_view(ckpt, cfg) if grafting else ckpt.config
    check_target_identity(parse_draft_config(cfg), seen, f"--target {target}")
    progress(f"release check of {target}: {diagnose(ckpt, spec)['verdict']}")
    if grafting:
        _export_graft(job, spec, ckpt, parts, layer)
        return
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
    stored = stored_from_target(ckpt, keys)  # a quantised weight the exporters cannot write back: one line here
    writer = NativeWriter(native, stored, ckpt.fp8_block_size(), fp8_block(ckpt.config, {})[1])
    slots = _slots(ckpt, writer, keys)
    shards = sorted({ckpt.weight_map[name] for name in slots}, key=natural_order)
    index = _target_index(ckpt)
    for n, file in enumerate(shards, 1):
        progress(f"rewriting shard {file} ({n}/{len(shards)})")
        _rewrite_shard(ckpt, writer, slots, file, tmp / file, index)
    unquantised = sorted(k for k in keys if stored[k].scheme is None and ckpt.quantised(k))
    config = ckpt.config
    if unquantised:  # the layer leaves the target's quantisation: its prefix joins the config's exclusion list
        config = excluded_config(config, [spec.key(spec.keys.block, ckpt.config, i).rstrip(".") for _, i in layers])
    write_json(tmp / INDEX_FILE, index)
    write_json(tmp / CONFIG_FILE, config)
    written = [i for _, i in layers]
    notes = engine_mismatches(spec, cfg, ("vllm", "sglang"))
    for note in notes:
        progress("note: " + note)
    serve = Serving(str(job.final or "<this directory>"), max(job.config.speculative_tokens, len(written)), notes)
    (tmp / README_FILE).write_text(_stitched_readme(ckpt, spec, written, shards, writer, unquantised, serve))
    record["engine_notes"] = notes  # the model card prints them beside the launch line of the engine they name
    record.update(
        target=ckpt.source,
        target_commit=ckpt.commit,
        mtp_layer=layer,
        mtp_layers=written,
        **({"step_layers": cfg.get("step_layers", "cycle")} if len(written) > 1 else {}),
        spec=spec.name,
        **computation_record(spec, cfg),
        overlay_files=[*shards, INDEX_FILE, *([CONFIG_FILE] if unquantised else [])],
        requantised_fp8=sorted(writer.requantised),
        requantised={scheme: sorted(v) for scheme, v in sorted(writer.quantised.items())},
        unquantised=unquantised,
        **({"unquantised_why": UNQUANTISED_WHY} if unquantised else {}),
    )


def _export_graft(job: ExportJob, spec: Spec, ckpt: Checkpoint, parts: list[NativeLayer], layer: int) -> None:
    """The stitched export into a release without an MTP layer (`formats/graft.py`)."""
    tokenizer = (job.cfg.get("mtp2draft") or {}).get("tokenizer_sha256")
    fields = graft(ckpt, spec, parts, job.out, _target_index(ckpt), tokenizer, job.progress)
    written = [part.layer for part in parts]
    source = local_ref(ckpt.source) if ckpt.is_local else ckpt.source
    k = max(job.config.speculative_tokens, len(written))
    lines = launch_lines("stitched", source, local_ref(str(job.final or "<this directory>")), k, spec, len(written),
                         ckpt.commit)  # fmt: skip
    serve = [cmd for label, line in lines.items() for cmd in (line.split(" && ") if label == "overlay" else [line])]
    (job.out / README_FILE).write_text(graft_readme(ckpt, spec, written, fields, serve))
    job.record.update(
        target=ckpt.source,
        target_commit=ckpt.commit,
        mtp_layer=layer,
        mtp_layers=written,
        spec=spec.name,
        **computation_record(spec, job.cfg),
        **fields,
    )


def _slots(ckpt: Checkpoint, writer: NativeWriter, keys: list[str]) -> dict[str, list[str]]:
    """Target tensor name -> the names written in its place: the same name(s), or for a quantised weight written
    unquantised, the logical key where its data part was and nothing for its other parts."""
    slots: dict[str, list[str]] = {}
    for key in keys:
        old, new = ckpt.needed_keys([key]), writer.names(key)
        if old == new:
            slots.update({name: [name] for name in old})
        else:  # the slot of a different tensor: a bf16 [N, K] in place of NVFP4's packed [N, K/2] and its scales
            slots.update({name: ([f"+{n}" for n in new] if i == 0 else []) for i, name in enumerate(old)})
    return slots


def _rewrite_shard(
    ckpt: Checkpoint, writer: NativeWriter, slots: dict[str, list[str]], file: str, out: Path, index: dict
) -> None:
    """Shard `file` of the target with the layer's tensors in their slots (others copied), `index` updated."""
    infos = sorted(ckpt.header(file).values(), key=lambda i: i.start)
    layout = []
    for info in infos:
        if info.name not in slots:
            layout.append((info.name, ST_DTYPES[info.dtype][0], tuple(info.shape)))
            continue
        for name in slots[info.name]:
            swapped, name = name.startswith("+"), name.removeprefix("+")
            dtype, shape = writer.spec(name)
            if not swapped and tuple(info.shape) != tuple(shape):
                raise DraftError(f"the draft's {name} would be {list(shape)}, the target stores {list(info.shape)}")
            layout.append((name, dtype, tuple(shape)))
    weight_map, size = index["weight_map"], index.get("metadata", {}).get("total_size")
    for info in infos:
        if slots.get(info.name, [info.name]) != [info.name]:  # replaced by another tensor, or dropped
            weight_map.pop(info.name, None)
            size = size - info.nbytes if isinstance(size, int) else size
    for name, dtype, shape in layout:
        if name not in weight_map:
            weight_map[name] = file
            size = size + math.prod(shape) * dtype.itemsize if isinstance(size, int) else size
    if isinstance(size, int):
        index["metadata"]["total_size"] = size
    with SafetensorsWriter(out, layout, {"format": "pt", **STITCHED_MARK}) as dst:
        for run in contiguous_runs(infos, COPY_RUN_BYTES):
            kept = ckpt.read_raw([i.name for i in run if i.name not in slots])
            for info in run:
                for name in slots.get(info.name, [info.name]):
                    name = name.removeprefix("+")
                    dst.write(name, writer.get(name) if info.name in slots else kept[name])


def _marked(file: Path) -> bool:
    """Whether shard `file` was written by the stitched export (an unreadable one counts: its check says why)."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), "pt") as f:
            return all((f.metadata() or {}).get(k) == v for k, v in STITCHED_MARK.items())
    except Exception:  # noqa: BLE001 - safetensors raises its own errors and OSError alike
        return True


@dataclass(frozen=True)
class Serving:
    """What the overlay's README says of serving it: where the overlay is, the k its lines draft, the engine notes."""

    draft: str
    k: int
    notes: list[str]


def _stitched_readme(
    ckpt: Checkpoint,
    spec: Spec,
    layers: list[int],
    shards: list[str],
    writer: NativeWriter,
    unquantised: list[str],
    serve: Serving,
) -> str:
    """The overlay's README.md, every text in it through the one redactor (a source path may hold a token)."""
    return redact(_readme_text(ckpt, spec, layers, shards, writer, unquantised, serve))


def _readme_text(
    ckpt: Checkpoint,
    spec: Spec,
    layers: list[int],
    shards: list[str],
    writer: NativeWriter,
    unquantised: list[str],
    serve: Serving,
) -> str:
    where = ckpt.source + (f" (commit {ckpt.commit})" if ckpt.commit else "")
    block = ckpt.fp8_block_size()
    notes = [f"{len(writer.requantised)} FP8 weights were requantised per {block[0]}x{block[1]} block with fresh "
             "`_scale_inv`."] if writer.requantised else []  # fmt: skip
    for scheme, weights in sorted(writer.quantised.items()):
        notes.append(f"{len(weights)} weights were requantised as {scheme}, under the checkpoint's own part names.")
    if unquantised:
        notes.append(
            f"{len(unquantised)} weights the target stores quantised were written in "
            f"{str(writer.stored[unquantised[0]].dtype).removeprefix('torch.')}, their quantised parts dropped from "
            f"the shard and the index, and the MTP layer excluded in `config.json`'s quantization_config: "
            f"{UNQUANTISED_WHY}"
        )
    quant = " ".join(notes) + (" Every other tensor keeps the target's dtype." if notes else "")
    quant = quant or "Every tensor keeps the target's dtype."
    shards = [*shards, *([CONFIG_FILE] if unquantised else [])]
    files = "\n".join(f"- `{f}`" for f in [*shards, INDEX_FILE])
    which = f"MTP layer {layers[0]}" if len(layers) == 1 else f"MTP layers {', '.join(map(str, layers))}"
    source = local_ref(ckpt.source) if ckpt.is_local else ckpt.source
    lines = launch_lines("stitched", source, local_ref(serve.draft), serve.k, spec, len(layers), ckpt.commit)
    overlay = "\n".join(lines.pop("overlay").split(" && "))
    view = config_view_note(spec)
    engines = serving_text(lines, serve.notes) if lines else []
    served = (
        "\n".join(engines).strip()
        if engines
        else f"No engine in mtp2draft's table runs this overlay for {spec.name} targets (`mtp2draft specs`)."
    )
    return f"""# Stitched MTP layer ({spec.name})

The fine-tuned {which} of `{where}`, written back under the checkpoint's own key names, dtypes and
quantization by mtp2draft {__version__}. {quant}

This directory is an overlay, not a whole checkpoint: it holds only the shards that contain MTP tensors (their
other tensors are the target's, unchanged) and the index.

{files}

{
        "`config.json` is the target's with the MTP layer excluded from its quantisation (the lines copy it too)."
        if unquantised
        else "`config.json` is the target's, unchanged."
    }

## Overlay it onto the target

Run from the directory the export was written from (`{serve.draft}` is the overlay):

```bash
{overlay}
```
{chr(10) + view + chr(10) if view else ""}
## Serve

{served}
"""


def _validate_stitched(path: Path, cfg: dict[str, Any]) -> list[str]:
    from mtp2draft.formats import get_format

    if get_format("stitched-dspark").detect(cfg):  # an overlay of a release's DSpark stages
        return get_format("stitched-dspark").validate(path, cfg)
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
    holding = sorted({weight_map[k] for k in mtp_keys} & present)
    if holding and not any(_marked(path / f) for f in holding):  # a target with no overlay laid over it
        return [
            f"{', '.join(holding)} holds the MTP layer as the target was released, not as mtp2draft stitched it: "
            "this is the untouched target (lay the overlay over it with the lines of the export's README)"
        ]
    for key in mtp_keys:
        if weight_map[key] not in present:
            problems.append(f"the index maps MTP tensor {key} to {weight_map[key]}, which is missing from the overlay")
    block = fp8_block_size(cfg)
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(count):
        try:
            shapes, _ = meta_checkpoint(spec, cfg, cfg, i, weight_map.__contains__)  # in the overlay's layout
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
        quantised, parts = quantised_problems(path / file, headers, cfg, expected)  # e.g. DeepSeek-V4's `.scale`
        problems += quantised
        # as the engines read it: a float MTP linear the quantisation config does not exclude is built quantised
        problems += unexcluded(cfg, {k: v for k, v in headers.items() if k in expected})
        for key in sorted(set(headers) & set(expected) - parts, key=natural_order):
            if list(headers[key][1]) != list(expected[key]):
                problems.append(f"{key} has shape {headers[key][1]}, the config implies {list(expected[key])}")
            else:
                chunks = fp8_row_chunks(spec, cfg, key)
                problems += fp8_problems(key, headers[key][0], expected[key], headers, block, chunks)
        mtp_here = [
            k
            for k in headers
            if k not in parts and (k in expected or (k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] in expected))
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
    """The engines' lines for the overlaid target; the overlay's own lines are `serving.overlay_lines`."""
    return {
        "vLLM": "vllm serve ./target-stitched --speculative-config "
        f'\'{{"method": "mtp", "num_speculative_tokens": {k}}}\'',
        "SGLang": f"python -m sglang.launch_server --model ./target-stitched --speculative-algorithm EAGLE "
        f"{sglang_steps(k)}",
    }


def _usable(spec: Spec) -> bool:
    """Any family with an MTP layer: the layer goes back where it came from."""
    return True


# Format(write, validate, detect, launch_lines, usable, codec): see formats/__init__.py
PROVIDES: dict[str, Format] = {"stitched": Format(_write, _validate_stitched, _is_stitched, _launch_lines, _usable)}
