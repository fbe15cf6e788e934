"""`export --format stitched` of a release's DSpark stages (a dspark directory `convert` wrote: names `mtp.{i}.*`,
values dequantised): the stages written back under the release's own names, dtypes and quantisation, as an overlay of
the shards that hold them (their other tensors unchanged), the index and a README. The registered format
`stitched-dspark` is what `validate` and the model card detect such an overlay as.

The stages are the same kind of tensors as DeepSeek-V4's MTP layer, so they are stored back the way `formats/stitched.py`
stores that layer: `formats/native.NativeWriter` with `formats/requant.py`'s writers (FP8 e4m3 with an e8m0 `.scale`
per 128 x 128 block, FP4 e2m1 packed with an e8m0 `.scale` per 32 inputs), every other tensor cast to the dtype the
release stores it in. Only the directory's tensors are needed (names and values), no module: a drafter that
`convert` wrote and nothing changed comes back as the release's bytes.

vLLM 0.32 serves such a release with `{"method": "dspark"}` and no draft model (`config/speculative.py`: "DeepSeek
DSpark can ship the weights inside the target checkpoint"; `num_speculative_tokens` defaults to
`dspark_block_size`); its CPU build refuses DSpark (docs/engines.md).

What this module does not do: run, train or evaluate the stages, or write a release without them (no graft).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft._version import __version__
from mtp2draft.checkpoint.reader import INDEX_FILE, open_checkpoint
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import dspark_fields
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats.common import (
    README_FILE,
    STITCHED_MARK,
    finite_file,
    quantised_problems,
    read_headers,
    read_json,
)
from mtp2draft.formats.native import NativeWriter, fp8_block, natural_order, stored_from_target
from mtp2draft.formats.requant import UNQUANTISED_WHY, excluded_config
from mtp2draft.formats.serving import launch_lines, local_ref, serving_text
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.redact import redact

PREFIX = "mtp."


class Stages:
    """The converted stages as `NativeWriter` reads a layer: `shapes` and `get(key)` (float values)."""

    def __init__(self, weights: Path):
        from safetensors import safe_open

        self._fh = safe_open(str(weights), framework="pt")
        self.shapes = {k: tuple(self._fh.get_slice(k).get_shape()) for k in self._fh.keys()}  # noqa: SIM118

    def get(self, key: str) -> torch.Tensor:
        return self._fh.get_tensor(key).float()


def export_dspark_stitched(job: ExportJob) -> None:
    """The `stitched` writer for a dspark directory (`formats/stitched.py` hands it over)."""
    from mtp2draft.formats.stitched import _rewrite_shard, _slots, _target_index

    if job.cfg.get("draft_kind") != "dspark":
        raise DraftError(
            f"{job.src} is a Qwen3-style DSpark drafter (speculators' layout): no release stores it under mtp.*; "
            "export it with --format speculators-dspark"
        )
    if not job.target:
        raise DraftError("the stitched format needs --target: the release whose DSpark stages the draft replaces")
    ckpt = open_checkpoint(job.target, job.hub.revision, job.hub.token)
    fields = dspark_fields(ckpt.config)
    recorded = job.cfg.get("dspark") or {}
    if fields is None or fields.summary() != recorded:
        raise DraftError(
            f"--target {job.target} does not ship this DSpark drafter: its dspark settings are "
            f"{fields.summary() if fields else None}, the draft's {recorded}"
        )
    stages = Stages(job.src / WEIGHTS_FILE)
    keys = sorted(stages.shapes, key=natural_order)
    theirs = set(ckpt.keys_with_prefix(PREFIX))
    if set(keys) != theirs:
        extra, lacking = sorted(set(keys) - theirs), sorted(theirs - set(keys))
        raise DraftError(f"the draft's stages do not match --target {job.target}'s: the draft alone has "
                         f"{extra[:2]}, the target alone {lacking[:2]}")  # fmt: skip
    wrong = [k for k in keys if tuple(ckpt.shape_of(k)) != stages.shapes[k]]
    if wrong:
        raise DraftError(f"the draft's {wrong[0]} is {list(stages.shapes[wrong[0]])}, --target stores "
                         f"{list(ckpt.shape_of(wrong[0]))}")  # fmt: skip
    stored = stored_from_target(ckpt, keys)
    writer = NativeWriter(stages, stored, ckpt.fp8_block_size(), fp8_block(ckpt.config, {})[1])  # type: ignore[arg-type]
    slots = _slots(ckpt, writer, keys)
    shards = sorted({ckpt.weight_map[name] for name in slots}, key=natural_order)
    index = _target_index(ckpt)
    for n, file in enumerate(shards, 1):
        job.progress(f"rewriting shard {file} ({n}/{len(shards)})")
        _rewrite_shard(ckpt, writer, slots, file, job.out / file, index)
    unquantised = sorted(k for k in keys if stored[k].scheme is None and ckpt.quantised(k))
    config = ckpt.config
    if unquantised:  # a ModelOpt / compressed-tensors release: the stages leave its quantisation
        config = excluded_config(config, sorted({".".join(k.split(".")[:2]) for k in keys}))
    write_json(job.out / INDEX_FILE, index)
    write_json(job.out / CONFIG_FILE, config)
    block = fields.block_size
    source = local_ref(ckpt.source) if ckpt.is_local else ckpt.source
    draft = local_ref(str(job.final or "<this directory>"))
    (job.out / README_FILE).write_text(redact(_readme(ckpt.source, ckpt.commit, source, draft, block, shards, writer,
                                                      unquantised)))  # fmt: skip
    job.record.update(
        target=ckpt.source,
        target_commit=ckpt.commit,
        draft_kind="dspark",
        speculative_tokens=block,
        overlay_files=[*shards, INDEX_FILE, *([CONFIG_FILE] if unquantised else [])],
        requantised_fp8=sorted(writer.requantised),
        requantised={scheme: sorted(v) for scheme, v in sorted(writer.quantised.items())},
        unquantised=unquantised,
        **({"unquantised_why": UNQUANTISED_WHY} if unquantised else {}),
    )


def _readme(where, commit, source, draft, block, shards, writer, unquantised) -> str:
    lines = launch_lines("stitched-dspark", source, draft, block, revision=commit)
    overlay = "\n".join(lines.pop("overlay").split(" && "))
    quant = [f"{len(v)} weights were requantised as {s}, under the release's own part names." for s, v in
             sorted(writer.quantised.items())]  # fmt: skip
    quant += (
        [f"{len(writer.requantised)} FP8 weights were requantised with fresh scales."] if writer.requantised else []
    )
    quant += [f"{len(unquantised)} weights were written unquantised: {UNQUANTISED_WHY}"] if unquantised else []
    files = "\n".join(f"- `{f}`" for f in [*shards, INDEX_FILE])
    return f"""# Stitched DSpark drafter

The DSpark stages of `{where}`{f" (commit {commit})" if commit else ""}, written back under the release's own names
(`mtp.*`), dtypes and quantisation by mtp2draft {__version__}. {" ".join(quant) or "Every tensor keeps its dtype."}

This directory is an overlay: only the shards holding DSpark tensors (their other tensors unchanged) and the index.

{files}

## Overlay it onto the target

```bash
{overlay}
```

## Serve

The block size is {block}: each draft step proposes one block of {block} tokens.

{chr(10).join(serving_text(lines)).strip()}
"""


def _validate(path: Path, cfg: dict[str, Any]) -> list[str]:
    """The overlay as the release's loader reads it: the index's DSpark tensors in the overlay's shards, each shard
    marked as written here, the quantised weights' parts consistent and finite, the heads shaped as the config says."""
    fields = dspark_fields(cfg)
    if fields is None:
        return ["config.json declares no DSpark drafter (no dspark_block_size)"]
    index = read_json(path / INDEX_FILE)
    weight_map = index.get("weight_map") if index else None
    if not isinstance(weight_map, dict):
        return [f"{INDEX_FILE} is missing or has no weight_map"]
    present = {p.name for p in path.glob("*.safetensors")}
    problems = [
        f"{f} is in the overlay but the index maps no tensor to it" for f in sorted(present - set(weight_map.values()))
    ]
    keys = [k for k in weight_map if k.startswith(PREFIX)]
    if not keys:
        return [*problems, "the index maps no mtp.* tensor"]
    problems += [
        f"the index maps {k} to {weight_map[k]}, missing from the overlay" for k in keys if weight_map[k] not in present
    ]
    text = cfg.get("text_config") or cfg
    hidden, vocab, rank = text.get("hidden_size"), text.get("vocab_size"), fields.markov_rank
    expected = {"mtp.0.main_proj.weight": (hidden, len(fields.target_layer_ids) * hidden)}
    if rank:
        last = max(int(k.split(".")[1]) for k in keys)
        expected |= {f"mtp.{last}.markov_head.markov_w1.weight": (vocab, rank),
                     f"mtp.{last}.markov_head.markov_w2.weight": (vocab, rank),
                     f"mtp.{last}.confidence_head.proj.weight": (1, hidden + rank)}  # fmt: skip
    for file in sorted(present & set(weight_map.values())):
        headers = read_headers(path / file)
        if (read_safetensors_meta(path / file) or {}).get("mtp2draft") != STITCHED_MARK["mtp2draft"]:
            problems.append(f"{file} holds the stages as the release shipped them, not as mtp2draft stitched them")
        mapped = {k for k, f in weight_map.items() if f == file}
        problems += [f"the index maps {k} to {file}, which does not hold it" for k in sorted(mapped - set(headers))]
        quantised, parts = quantised_problems(path / file, headers, cfg, expected)
        problems += quantised
        for key in sorted(set(expected) & set(headers) - parts):
            if tuple(headers[key][1]) != expected[key]:
                problems.append(f"{key} has shape {headers[key][1]}, the config implies {list(expected[key])}")
        problems += finite_file(path / file, [k for k in headers if k.startswith(PREFIX) and k not in parts and
                                             headers[k][0] not in ("F8_E4M3", "F8_E8M0", "I8", "U8")])  # fmt: skip
    return problems


def read_safetensors_meta(file: Path) -> Mapping[str, str] | None:
    from safetensors import safe_open

    with safe_open(str(file), "pt") as fh:
        return fh.metadata()


def _launch_lines(target: str, draft: str, k: int) -> dict[str, str]:
    """The engines' lines for the overlaid release (k: its block size); the overlay's own: `serving.overlay_lines`."""
    return {
        "vLLM": "vllm serve ./target-stitched --speculative-config "
        f'\'{{"method": "dspark", "num_speculative_tokens": {k}}}\'',
        "SGLang": "python -m sglang.launch_server --model ./target-stitched --speculative-algorithm DSPARK "
        f"--speculative-dspark-block-size {k}",
    }


def _declares_dspark(config: Mapping[str, Any]) -> bool:
    """A release config with DSpark settings (the overlay carries the release's config)."""
    try:
        return dspark_fields(config) is not None
    except Exception:  # noqa: BLE001 - a malformed field: not this format's to detect
        return False


PROVIDES: dict[str, Format] = {
    "stitched-dspark": Format(
        write=export_dspark_stitched,
        validate=_validate,
        detect=lambda config: _declares_dspark(config),
        launch_lines=_launch_lines,
        usable=lambda spec: False,
    ),
}
