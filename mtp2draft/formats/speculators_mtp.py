"""The `speculators-mtp` format (native MTP): the draft as speculators' `mtp` speculator type (`MTPDraftModel`), the
directory `speculators.SpeculatorModel.from_pretrained` loads and speculators' own MTP fine-tuning and `stitch-mtp`
start from. Facts from speculators 0.9.0 (`docs/speculators-mtp.md` cites the files):
- weights: the layer under `mtp_layers.0.` (`hidden_layernorm`, `token_layernorm`, `input_proj` over [embed, hidden],
  then transformers' own decoder layer of the family, fused experts, then `final_layernorm`), no embedding or head
  (speculators loads both from the verifier named in the config);
- config.json: `speculators_model_type: "mtp"`, `architectures: ["MTPDraftModel"]`, `num_nextn_predict_layers: 1`,
  the target's (text) config as `transformer_layer_config` and a `speculators_config` (greedy proposal of k tokens,
  the verifier).
Only families whose spec names a speculators `mtp_model_type` (`[speculators]`) export to it; any other is refused.

What this module does not do: serve the draft (no engine loads this directory directly: vLLM 0.32 has no `mtp`
speculators type; `speculators stitch-mtp` or `export --format stitched` writes it back into the target), or keep
FP8 (speculators' layer is plain `nn.Linear`: weights are written in `--dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import registry
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats import native as nat
from mtp2draft.formats.common import (
    load_weights,
    nonfinite,
    required_value_problems,
    section,
    speculators_proposal,
    speculators_section_problems,
)
from mtp2draft.formats.eagle3 import verifier_of
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE, Hidden
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

SPECULATORS_VERSION = "0.9.0"  # the release the layout below was read from
MODEL_TYPE = "mtp"  # speculators_model_type and speculators_config.algorithm
ARCHITECTURE = "MTPDraftModel"
# what speculators dispatches on: config.json must hold these values
REQUIRED = {"architectures": [ARCHITECTURE], "speculators_model_type": MODEL_TYPE}
LAYER = "mtp_layers.0."  # MTPDraftModel.mtp_layers: one layer (MTPSpeculatorConfig refuses more)
# mtp2draft's native module names -> MTPDraftModel's (MTPLayerMixin._setup_mtp_modules; the decoder layer's own
# modules keep their names under the layer)
MODULE_NAMES = {
    "enorm.": LAYER + "token_layernorm.",
    "hnorm.": LAYER + "hidden_layernorm.",
    "eh_proj.": LAYER + "input_proj.",
    "final_norm.": LAYER + "final_layernorm.",
    "block.": LAYER,
}
# the computation MTPDraftModel.forward runs: the final norm applied, its output (post-norm) handed to the next step
SPECULATORS_COMPUTATION = {"final_norm": True, "hidden_handover": Hidden.POST_NORM}
# tensors speculators takes from the verifier: one in the draft would be used instead of the verifier's
VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight")


def speculators_name(module_key: str) -> str:
    """MTPDraftModel's name for tensor `module_key` of mtp2draft's native module."""
    for ours, theirs in MODULE_NAMES.items():
        if module_key.startswith(ours):
            return theirs + module_key[len(ours) :]
    raise DraftError(f"{module_key} is not a tensor of the native MTP layer")


def served_families() -> dict[str, str]:
    """spec name -> speculators' `mtp_model_type`, for the families speculators' `mtp` type builds."""
    return {name: s.speculators.mtp_model_type for name, s in registry().items() if s.speculators.mtp_model_type}


def check_served(spec: Spec) -> str:
    """The speculators model type of `spec`'s family; a one-line DraftError naming the served ones otherwise."""
    if not spec.speculators.mtp_model_type:
        raise DraftError(
            f"speculators {SPECULATORS_VERSION} has no mtp speculator type for {spec.name} targets; it serves "
            f"{', '.join(served_families())} (a spec's [speculators] mtp_model_type)"
        )
    return spec.speculators.mtp_model_type


def layer_config(spec: Spec, target_config: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """`transformer_layer_config`: the target's (text) config, which speculators builds the decoder layer from (at
    the last full-attention index of `layer_types`), with the spec's block overrides that are not per-layer lists
    (e.g. Qwen3-Next's `mlp_only_layers = []`: the MTP block's MLP is MoE) and the weights' dtype."""
    text = spec.text_config(target_config)
    n = spec.num_layers(target_config)
    for key, value in spec.config.block_overrides.items():
        one_entry = isinstance(value, (list, tuple)) and len(value) == 1  # the block's entry of a per-layer list
        per_layer = one_entry or (isinstance(text.get(key), list) and len(text[key]) == n)
        if n == 1 or not per_layer:
            text[key] = list(value) if isinstance(value, tuple) else value
    text.pop("dtype", None)
    text["torch_dtype"] = str(dtype).removeprefix("torch.")
    return text


def speculators_mtp_config(
    spec: Spec, target_config: Mapping[str, Any], dtype: torch.dtype, k: int, verifier: Mapping[str, Any]
) -> dict[str, Any]:
    """config.json of speculators' `MTPSpeculatorConfig` for a native draft of `spec`'s family."""
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "num_nextn_predict_layers": 1,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [speculators_proposal(k)],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier.get("name_or_path"), "architectures": verifier["architectures"]},
        },
        "transformer_layer_config": layer_config(spec, target_config, dtype),
        "tie_word_embeddings": False,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _write(job: ExportJob) -> None:
    """The `write` of this format: fills job.out from the native draft job.src."""
    from safetensors.torch import load_file

    nat.refuse_chain(job.cfg, "speculators-mtp", "MTPSpeculatorConfig refuses more than one")
    spec, target_config, layer = nat.native_input(job.src, job.cfg)
    model_type = check_served(spec)
    if spec.text_config(target_config).get("model_type") != model_type:
        raise DraftError(
            f"the target's (text) config has model_type {spec.text_config(target_config).get('model_type')!r}; "
            f"speculators builds {spec.name}'s MTP layer from {model_type!r}"
        )
    dtype = TORCH_DTYPES[job.config.dtype]
    state = load_file(str(job.src / WEIGHTS_FILE))
    check_tensors(job.src / WEIGHTS_FILE, state)
    tensors = {speculators_name(k): v.to(dtype) if v.is_floating_point() else v for k, v in sorted(state.items())}
    verifier = verifier_of(job.cfg, job.provenance, job.config.verifier, job.progress)
    verifier["architectures"] = list(target_config.get("architectures") or verifier["architectures"])
    mine = nat.computation_record(spec, job.cfg)
    differ = [f"{k} {mine[k]} (draft) vs {v} (speculators)" for k, v in SPECULATORS_COMPUTATION.items() if mine[k] != v]
    if differ:
        job.progress(f"note: speculators' MTPDraftModel computes the layer differently: {'; '.join(differ)}")
    job.progress(f"writing {len(tensors)} tensors (speculators mtp layout, {job.config.dtype})")
    save_tensors(job.out / WEIGHTS_FILE, tensors, {"format": "pt"})
    out_cfg = speculators_mtp_config(spec, target_config, dtype, job.config.speculative_tokens, verifier)
    write_json(job.out / CONFIG_FILE, {**out_cfg, "mtp2draft": {**(job.cfg.get("mtp2draft") or {}), "spec": spec.name}})
    job.record.update(dtype=job.config.dtype, mtp_layer=layer, spec=spec.name, speculators_mtp=model_type, **mine)


def _spec_of(layer: Mapping[str, Any]) -> Spec | None:
    """The spec whose family speculators builds from a `transformer_layer_config` of this model_type."""
    return next((s for s in registry().values() if s.speculators.mtp_model_type == layer.get("model_type")), None)


def _expected_shapes(spec: Spec, layer: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """MTPDraftModel name -> shape of every tensor of the layer, from meta tensors of the native module."""
    target = {spec.config.text_config: dict(layer)} if spec.config.text_config else dict(layer)
    with torch.device("meta"):
        module = NativeMtpDraft(spec, target)
    return {speculators_name(k): tuple(v.shape) for k, v in module.state_dict().items()}


def _validate(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems = required_value_problems(cfg, REQUIRED)  # speculators' MTPDraftModel: the format's, every family's
    if not cfg.get("speculators_version"):
        problems.append("speculators_version is missing")
    if cfg.get("num_nextn_predict_layers", 1) != 1:
        problems.append(f"num_nextn_predict_layers is {cfg.get('num_nextn_predict_layers')}; speculators' mtp needs 1")
    problems += speculators_section_problems(cfg, MODEL_TYPE)
    layer = section(cfg, "transformer_layer_config", " (speculators builds the layer from it)", problems)
    spec = _spec_of(layer) if layer is not None else None
    if layer is not None and spec is None:
        problems.append(
            f"transformer_layer_config.model_type is {layer.get('model_type')!r}; speculators' mtp type builds "
            f"{', '.join(served_families().values())}"
        )
    weights = load_weights(path, problems)
    if weights is None or layer is None or spec is None:
        return problems
    try:
        expected = _expected_shapes(spec, layer)
    except Exception as exc:
        return [*problems, f"cannot build the {spec.name} MTP layer from transformer_layer_config: {exc}"]
    for name in VERIFIER_TENSORS:
        if name in weights:
            problems.append(f"{name} is present: speculators would use it instead of the verifier's")
    for name in sorted(set(expected) - set(weights)):
        problems.append(f"{name} is missing (speculators would leave it at its initialisation)")
    for name in sorted(set(weights) - set(expected) - set(VERIFIER_TENSORS)):
        problems.append(f"{name} is not a tensor of speculators' {spec.speculators.mtp_model_type} MTP layer")
    want = TORCH_DTYPES.get(str(cfg.get("dtype") or layer.get("torch_dtype")))
    for name in sorted(set(weights) & set(expected)):
        t = weights[name]
        if tuple(t.shape) != expected[name]:
            problems.append(f"{name} has shape {list(t.shape)}, the config implies {list(expected[name])}")
        if t.is_floating_point() and want is not None and t.dtype != want:
            problems.append(f"{name} is {str(t.dtype).removeprefix('torch.')}, config.json says {cfg.get('dtype')}")
        if (msg := nonfinite(name, t)) is not None:
            problems.append(msg)
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
def _launch_lines(target: str, draft: str, k: int) -> dict[str, str]:
    return {
        "speculators (write it back into the target for vLLM's native MTP)": (
            f"speculators stitch-mtp {draft} {target} --output-path STITCHED && vllm serve STITCHED "
            f'--speculative-config \'{{"method": "mtp", "num_speculative_tokens": {k}}}\''
        ),
    }


# Format(write, validate, detect, launch_lines, usable): see formats/__init__.py. No engine serves the directory
# itself (vLLM 0.32's speculators types: eagle3, peagle, dflash, dflash2, dspark), so `run` never picks it.
PROVIDES: dict[str, Format] = {
    "speculators-mtp": Format(
        write=_write,
        validate=_validate,
        detect=lambda config: config.get("speculators_model_type") == MODEL_TYPE,
        launch_lines=_launch_lines,
        usable=lambda spec: False,
        check_family=check_served,
    ),
}

__all__ = ["MODULE_NAMES", "check_served", "served_families", "speculators_mtp_config", "speculators_name"]
