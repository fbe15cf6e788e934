"""The stitched export into a release that holds no MTP layer (a fine-tune that dropped it, a quantised export that
never wrote it): the draft's layer *grafted* as the quantised re-releases ship one, as an overlay.

- the layer in its own shard, `model-mtp-00001-of-00001.safetensors`, under the release's own key names (the spec's
  templates on the release's config), in the release's float dtype (bf16 on every release we know): an int4 / FP4
  layer is where acceptance collapses (`target/release.py` SCHEME_FIT), so the graft is never quantised;
- the copies of the embedding and head some families store inside the layer (the spec's `embed` / `head` keys) are
  the release's own trunk tensors, read as the engines read them (dequantised where the release quantised them);
- the release's index with the layer's keys added, and its config.json with the count field set to the layers
  grafted and, for a quantised release, the layer's prefix added to the exclusion list in the namespace of its keys
  (`requant.excluded_config`), so vLLM 0.34 builds it unquantised (`requant.UNQUANTISED_WHY`).

Refused in one line when the release's trunk is not the draft's (hidden size, vocabulary, layer count: every
computation field of config.json, `target/identity.py`; the tokenizer files where both sides have them), or when
its quantisation has no exclusion list the engines read (`requant.EXCLUDERS`).

What this module does not do: rewrite a release's existing layer (`stitched.py`), or write into the release: the
overlay goes to the export directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.reader import INDEX_FILE
from mtp2draft.checkpoint.tensors import Checkpoint
from mtp2draft.dtypes import ST_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.formats.common import STITCHED_MARK
from mtp2draft.formats.native import ChainLayers, NativeLayer, trunk_keys
from mtp2draft.formats.requant import EXCLUDERS, UNQUANTISED_WHY, excluded_config
from mtp2draft.kinds import CONFIG_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.redact import redact
from mtp2draft.target.release import layer_prefix

GRAFT_FILE = "model-mtp-00001-of-00001.safetensors"


def needs_graft(ckpt: Checkpoint, parts: list[NativeLayer]) -> bool:
    """True when the release holds none of the draft's tensors: there is no layer to rewrite, one is grafted."""
    return not any(ckpt.has(k) for part in parts for k in part.checkpoint_keys())


def _float_dtype(ckpt: Checkpoint, spec: Spec) -> torch.dtype:
    """The release's float dtype: its embedding's when stored as a 16/32-bit float, else bf16."""
    key = spec.key(spec.keys.target_embed, ckpt.config, 0)
    if ckpt.has(key) and not ckpt.quantised(key):
        dtype = ST_DTYPES[ckpt.info(key).dtype][0]
        if dtype in (torch.bfloat16, torch.float16, torch.float32):
            return dtype
    return torch.bfloat16


def _draft_dtype(native: ChainLayers, key: str) -> str:
    """The safetensors dtype the draft stores the module tensor behind checkpoint key `key` in."""
    part = native.owner[key]
    return part._fh.get_slice(part.prefix + part.module_of[key]).get_dtype()


def check_tokenizer(ckpt: Checkpoint, recorded: Mapping[str, str] | None) -> None:
    """Refuse a release whose tokenizer files differ from those `convert` recorded of the base (`tokenizer_sha256`;
    a hub release's, or a draft without the record, are not compared here: `evaluate` loads the tokenizer)."""
    from mtp2draft.conversion import tokenizer_digests

    if not recorded:
        return
    mine = tokenizer_digests(ckpt)
    for name in sorted(set(mine) & set(recorded)):
        if mine[name] != recorded[name]:
            raise DraftError(
                f"--target {ckpt.source}'s {name} differs from that of the checkpoint the draft was converted from: "
                "not the draft's trunk"
            )


def graft(
    ckpt: Checkpoint,
    spec: Spec,
    parts: list[NativeLayer],
    out: Path,
    index: dict[str, Any],
    tokenizer: Mapping[str, str] | None,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Write the graft overlay of `parts` over release `ckpt` into `out`; returns the record's fields."""
    check_tokenizer(ckpt, tokenizer)
    config = ckpt.config
    method = str((config.get("quantization_config") or {}).get("quant_method") or "")
    if ckpt.quant_method.schemes and method not in EXCLUDERS:
        raise DraftError(
            f"--target {ckpt.source} is quantised by {method or 'an unnamed method'}: a grafted bf16 layer needs an "
            f"exclusion list the engines read ({' / '.join(EXCLUDERS)} configs), which this one has not"
        )
    dtype = _float_dtype(ckpt, spec)
    native = ChainLayers(parts)
    shared = {k for part in parts for k in trunk_keys(spec, config, part.layer)}
    tensors = {k: native.get(k) for k in native.checkpoint_keys() if k not in shared}
    # weights in the release's dtype; a 1-D tensor the draft keeps in fp32 (DeepSeek's router bias) stays fp32
    tensors = {k: t if t.dim() == 1 and _draft_dtype(native, k) == "F32" else t.to(dtype) for k, t in tensors.items()}
    for part in parts:  # the copies of the release's embedding / head the layer stores, where the family stores them
        comp = spec.component_keys(config, part.layer)
        for copy, source in (("embed", spec.keys.target_embed), ("head", spec.keys.target_head)):
            if comp.get(copy) and comp[copy] not in tensors:
                key = spec.key(source, config, 0)
                tensors[comp[copy]] = ckpt.read_weights([key])[key].to(dtype)
    clash = sorted(k for k in tensors if k in ckpt.weight_map)
    if clash:
        raise DraftError(f"--target {ckpt.source} already holds {clash[0]}: not a release without an MTP layer")
    progress(f"grafting {len(tensors)} tensors into {GRAFT_FILE}")
    save_tensors(out / GRAFT_FILE, {k: v.contiguous() for k, v in tensors.items()}, {"format": "pt", **STITCHED_MARK})
    weight_map = index["weight_map"]
    weight_map.update(dict.fromkeys(tensors, GRAFT_FILE))
    size = index.get("metadata", {}).get("total_size")
    if isinstance(size, int):
        index["metadata"]["total_size"] = size + sum(math.prod(t.shape) * t.element_size() for t in tensors.values())
    prefixes = [layer_prefix([k for k in tensors if k in part.checkpoint_keys()]) for part in parts]
    if ckpt.quant_method.schemes:
        config = excluded_config(config, prefixes)
    config = _with_count(spec, config, len(parts))
    write_json(out / INDEX_FILE, index)
    write_json(out / CONFIG_FILE, config)
    return {
        "grafted": True,
        "grafted_dtype": str(dtype).removeprefix("torch."),
        "grafted_prefixes": prefixes,
        "overlay_files": [GRAFT_FILE, INDEX_FILE, CONFIG_FILE],
        **({"unquantised": sorted(tensors), "unquantised_why": UNQUANTISED_WHY} if ckpt.quant_method.schemes else {}),
    }


def identity_config(spec: Spec, release: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The release's config as the identity check sees it for a graft: its count field as the draft's base recorded
    it (the field says how many layers the release stores, which the graft sets; the trunk is every other field)."""
    field, nested = spec.config.mtp_count, spec.config.text_config
    base = spec.text_config(recorded).get(field)
    text = {k: v for k, v in spec.text_config(release).items() if k != field}
    if base is not None:
        text[field] = base
    return {**release, nested: text} if nested else text


def identity_view(ckpt: Checkpoint, draft_config: Mapping[str, Any]) -> dict[str, Any]:
    """The release's config as a native draft's identity check sees it: as stored, or for a release that holds no
    MTP layer (the graft's case) with the count field of the draft's base (`identity_config`)."""
    from mtp2draft.family.spec import find_spec
    from mtp2draft.target.release import layer_keys, trunk_names

    recorded = draft_config.get("target_config")
    try:
        spec = find_spec(ckpt.config)
    except Exception:  # another family: the identity check names it
        return ckpt.config
    if not isinstance(recorded, Mapping) or layer_keys(ckpt, spec, 0, trunk_names(spec, ckpt.config)):
        return ckpt.config
    return identity_config(spec, ckpt.config, dict(recorded))


def _with_count(spec: Spec, config: dict[str, Any], count: int) -> dict[str, Any]:
    """`config` with the count field the engines read set to `count` (in the nested text config where the family
    keeps it there)."""
    out = dict(config)
    nested = spec.config.text_config
    if nested:
        out[nested] = {**out[nested], spec.config.mtp_count: count}
    else:
        out[spec.config.mtp_count] = count
    return out


def graft_readme(ckpt: Checkpoint, spec: Spec, layers: list[int], record: dict[str, Any], serve: list[str]) -> str:
    """The overlay's README.md, through the one redactor (a source path may hold a token)."""
    where = ckpt.source + (f" (commit {ckpt.commit})" if ckpt.commit else "")
    files = "\n".join(f"- `{f}`" for f in record["overlay_files"])
    excluded = (
        f" The release is quantised ({ckpt.quant_method.name}): the layer is excluded from its quantisation in "
        f"`config.json` ({', '.join(p + '.*' for p in record['grafted_prefixes'])}). {UNQUANTISED_WHY}."
        if record.get("unquantised")
        else ""
    )
    fetch = f"cp -r {ckpt.source} ./target-stitched" if ckpt.is_local else (
        f"hf download {ckpt.source} --local-dir ./target-stitched"
    )  # fmt: skip
    body = "```bash\n" + "\n".join(serve) + "\n```" if serve else f"No engine in mtp2draft's table runs {spec.name}."
    return redact(f"""# Grafted MTP layer ({spec.name})

`{where}` holds no MTP layer. This overlay grafts MTP layer(s) {", ".join(map(str, layers))} into it, written by
mtp2draft as the quantised re-releases ship one: the layer in its own shard, in {record["grafted_dtype"]}, the index
naming it, and `config.json` with `{spec.config.mtp_count}` set to {len(layers)}.{excluded}

{files}

## Overlay it onto the release

```bash
{fetch}
cp {" ".join(record["overlay_files"])} ./target-stitched/
```

## Serve

{body}
""")
