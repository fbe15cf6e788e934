"""The `nextn` format (native MTP): a standalone NextN checkpoint for SGLang: no embedding or head, the spec's
`[nextn]` architecture, and the layer where the engine's loader looks for it (`[nextn] layers`): renumbered to trunk
layer 0 of a `num_hidden_layers: 1` config (SGLang's `export_deepseek_nextn.py` layout), or, for a loader that maps
the MTP keys past the trunk's last layer (DeepSeek-V4), under its own names as MTP layer 0 with the target's config.
Tensors are written in the target's own storage: FP8 with `_scale_inv` where it shipped FP8 (SGLang's export script
copies tensors in their stored dtype), and the schemes `formats/requant.py` writes (DeepSeek-V4's FP4 experts and
FP8 linears with e8m0 `.scale`) under the checkpoint's own part names.

What this module does not do: validate the draft directory it reads (`native.py`) or publish (`hub/upload.py`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX, fp8_block_size
from mtp2draft.draft.layout import native_to_checkpoint
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_nextn_spec, registry
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats import native as nat  # the helpers the native writers share
from mtp2draft.formats.common import (
    finite_file,
    fp8_problems,
    quantised_problems,
    read_headers,
    required_value_problems,
    sglang_steps,
)
from mtp2draft.formats.native import NativeLayer
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE, DraftKind
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import SafetensorsWriter


def nextn_text_fields(spec: Spec, target_config: Mapping[str, Any]) -> dict[str, Any]:
    """Text-config fields a one-layer NextN checkpoint changes: the layer and MTP counts set to 1, and every per-layer
    list (a list with one entry per trunk layer, e.g. Qwen3.5's `layer_types`) cut to the MTP block's one entry —
    the spec's `block_overrides` value when it names the field, else the list's first entry. transformers' config
    classes refuse a `layer_types` whose length is not `num_hidden_layers`. With `[nextn] layers = "target"` the
    trunk's fields are kept (the loader finds the layer past the trunk's last one) and only the MTP count is 1."""
    if spec.nextn.layers == "target":
        return {spec.config.mtp_count: 1}
    text = spec.text_config(target_config)
    n = spec.num_layers(target_config)
    fields: dict[str, Any] = {nat.num_layers_field(spec): 1, spec.config.mtp_count: 1}
    for key, value in text.items():
        if isinstance(value, list) and len(value) == n and n != 1:
            override = spec.config.block_overrides.get(key)
            fields[key] = list(override) if isinstance(override, (list, tuple)) and len(override) == 1 else value[:1]
    return fields


def _export_nextn(job: ExportJob) -> None:
    """The `write` of this format: fills job.out from the draft job.src."""
    src, cfg, tmp, provenance, record = job.src, job.cfg, job.out, job.provenance, job.record
    target, revision, token, progress = job.target, job.hub.revision, job.hub.token, job.progress
    nat.refuse_chain(cfg, "nextn", "SGLang's NextN loader reads layer 0 of num_hidden_layers: 1")
    spec, target_config, layer = nat.native_input(src, cfg)
    if not spec.nextn.architecture:
        raise DraftError(
            f"spec {spec.name} has no [nextn] section: SGLang has no standalone NextN loader for this family "
            "(export --format stitched writes the layer back into the target instead)"
        )
    native = NativeLayer(src / WEIGHTS_FILE, spec, target_config, layer)
    if target:
        ckpt = nat.open_target(target, cfg, revision, token)
        stored = nat.stored_from_target(ckpt, native.checkpoint_keys())
        block, ue8m0 = nat.fp8_block(ckpt.config, {"fp8_block_size": list(ckpt.fp8_block_size())})
        record.update(target=ckpt.source, target_commit=ckpt.commit)
    else:
        stored = nat.stored_from_provenance(native, spec, target_config, provenance)
        block, ue8m0 = nat.fp8_block(target_config, provenance)
    renamed = _renamed(native, spec, target_config, layer)
    writer = nat.NativeWriter(native, stored, block, ue8m0)
    order = sorted(native.checkpoint_keys(), key=lambda k: nat.natural_order(renamed[k]))
    names = [(name, _moved(name, key, renamed[key])) for key in order for name in writer.names(key)]
    plan = [(new, *writer.spec(old)) for old, new in names]
    where = "under its own names" if spec.nextn.layers == "target" else "renumbered to layer 0"
    progress(f"writing the NextN layer ({len(plan)} tensors; MTP layer {layer} {where})")
    with SafetensorsWriter(tmp / WEIGHTS_FILE, plan, {"format": "pt"}) as out:
        for old, new in names:
            out.write(new, writer.get(old))
    nextn_cfg = nat.with_text_fields(spec, target_config, **nextn_text_fields(spec, target_config))
    nextn_cfg["architectures"] = [spec.nextn.architecture]
    if not writer.requantised and not writer.quantised:  # a quantization_config over bf16 weights: SGLang wants scales
        nextn_cfg.pop("quantization_config", None)
    write_json(tmp / CONFIG_FILE, nextn_cfg)
    for note in nat.engine_mismatches(spec, cfg, ("sglang",)):  # SGLang is the engine that loads a NextN checkpoint
        progress("note: " + note)
    record.update(
        mtp_layer=layer,
        spec=spec.name,
        **nat.computation_record(spec, cfg),  # which computation (and hand-over) the draft was trained for
        requantised_fp8=sorted(renamed[k] for k in writer.requantised),
        requantised={scheme: sorted(renamed[k] for k in v) for scheme, v in sorted(writer.quantised.items())},
    )


def _key_config(spec: Spec, target_config: Mapping[str, Any]) -> dict[str, Any]:
    """The config whose MTP layer 0 has the NextN checkpoint's key names: one with no trunk layers (`[nextn] layers`
    "one": layer 0 at `model.layers.0.`), or the target's own ("target")."""
    if spec.nextn.layers == "target":
        return dict(target_config)
    return nat.with_text_fields(spec, target_config, **{nat.num_layers_field(spec): 0})


def _renamed(native: NativeLayer, spec: Spec, target_config: Mapping[str, Any], layer: int) -> dict[str, str]:
    """The draft's checkpoint key (MTP layer `layer` of the target) -> its name in the NextN checkpoint (layer 0)."""
    key_cfg = _key_config(spec, target_config)
    renamed: dict[str, str] = {}
    for module_key in dict.fromkeys(native.module_of.values()):
        shape = native._fh.get_slice(module_key).get_shape()
        meta = {module_key: torch.empty(shape, device="meta")}
        old = list(native_to_checkpoint(spec, target_config, layer, meta))
        new = list(native_to_checkpoint(spec, key_cfg, 0, meta))
        renamed.update(zip(old, new, strict=True))
    return renamed


def _moved(name: str, old: str, new: str) -> str:
    """A stored name of weight `old` (itself, its `_scale_inv`, a scheme's part such as V4's `.scale`) under the
    weight's new name `new`: the leading text in which `old` and `new` differ is replaced."""
    tail = len(os.path.commonprefix([old[::-1], new[::-1]]))
    head_old, head_new = old[: len(old) - tail], new[: len(new) - tail]
    return head_new + name[len(head_old) :] if name.startswith(head_old) else name


def _validate_nextn(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    spec = find_nextn_spec(cfg)
    if spec is None:
        return [f"model_type {cfg.get('model_type')!r} matches no spec: cannot check the NextN layer's tensors"]
    text = spec.text_config(cfg)
    if spec.nextn.layers == "one":  # "target": the trunk's fields are the target's, the layer past its last layer
        if text.get(nat.num_layers_field(spec)) != 1:
            problems.append(
                f"{nat.num_layers_field(spec)} is {text.get(nat.num_layers_field(spec))}, a NextN checkpoint has 1"
            )
        for key, value in text.items():
            if key in ("layer_types", "mlp_layer_types") and isinstance(value, list) and len(value) != 1:
                problems.append(f"{key} has {len(value)} entries; a NextN checkpoint has one layer")
    if spec.config.mtp_count in text and text.get(spec.config.mtp_count) != 1:
        problems.append(f"{spec.config.mtp_count} is {text.get(spec.config.mtp_count)}; SGLang's NextN loader needs 1")
    if spec.nextn.architecture:  # the family's NextN class, from its spec
        problems += required_value_problems(cfg, {"architectures": [spec.nextn.architecture]}, "SGLang")
    file = path / WEIGHTS_FILE
    if not file.is_file():
        return [*problems, f"{WEIGHTS_FILE} is missing"]
    try:
        headers = read_headers(file)
    except Exception as exc:
        return [*problems, f"{WEIGHTS_FILE} cannot be read: {exc}"]
    zero = _key_config(spec, cfg)
    try:
        expected, _ = nat.meta_checkpoint(spec, cfg, zero, 0)
    except Exception as exc:
        return [*problems, f"cannot build the {spec.name} MTP block from config.json: {exc}"]
    comp = spec.component_keys(zero, 0)
    # the layer's own embed/head copies and the target's (the spec's key names): SGLang shares the target's
    banned = {
        comp.get("embed"),
        comp.get("head"),
        *(spec.key(k, zero, 0) for k in (spec.keys.target_embed, spec.keys.target_head)),
    }
    banned.discard(None)
    for name in headers:
        if name in banned:
            problems.append(f"{name} is present: a NextN checkpoint shares the target's embedding and head")
    quant = cfg.get("quantization_config") or {}
    block = fp8_block_size(cfg)
    quantised, parts = quantised_problems(file, headers, cfg, expected)  # e.g. DeepSeek-V4's FP4 / FP8 + `.scale`
    problems += quantised
    for name, shape in expected.items():
        if name in parts:
            continue
        if name not in headers:
            problems.append(f"{name} is missing")
        elif list(headers[name][1]) != list(shape):
            problems.append(f"{name} has shape {headers[name][1]}, the config implies {list(shape)}")
        else:
            problems += fp8_problems(name, headers[name][0], shape, headers, block)
    for name in headers:
        if name not in expected and not name.endswith(SCALE_SUFFIX) and name not in banned | parts:
            problems.append(f"{name} is not a tensor of the NextN layer (layer 0)")
    has_fp8 = any(headers[n][0] in ("F8_E4M3", "F8_E5M2") for n in headers)
    if has_fp8 and not quant:
        problems.append("FP8 tensors but config.json has no quantization_config")
    if quant.get("quant_method") == "fp8" and not has_fp8:
        problems.append("quantization_config says fp8 but no tensor is FP8: SGLang would look for scales")
    problems += finite_file(
        file, [n for n in headers if n not in parts and (n in expected or n.endswith(SCALE_SUFFIX))]
    )
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
def _is_nextn(config: Mapping[str, Any]) -> bool:
    nextn = {s.nextn.architecture for s in registry().values() if s.nextn.architecture}
    return any(a in nextn for a in config.get("architectures") or [])  # the NextN classes the specs name


def _launch_lines(target: str, draft: str, k: int) -> dict[str, str]:
    return {
        "SGLang": f"python -m sglang.launch_server --model {target} --speculative-algorithm NEXTN "
        f"--speculative-draft-model-path {draft} {sglang_steps(k)}",
    }


def _usable(spec: Spec) -> bool:
    """SGLang loads a standalone NextN checkpoint for the family (it names the architecture) and serves its MTP."""
    return bool(spec.nextn.architecture) and spec.serves("sglang", DraftKind.MTP)


# Format(write, validate, detect, launch_lines, usable, codec): see formats/__init__.py
PROVIDES: dict[str, Format] = {
    "nextn": Format(_export_nextn, _validate_nextn, _is_nextn, _launch_lines, _usable, codec=nextn_text_fields),
}
