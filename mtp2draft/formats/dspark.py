"""The `speculators-dspark` format (DSpark): a Qwen3-style DSpark drafter as speculators' `dspark` speculator type, the
directory vLLM serves as the model itself (`vllm serve DRAFT`: it reads the verifier and k from the config) or as
`{"method": "dspark", "model": DRAFT}` beside the target. The layout is `draft.dspark_disk`'s (one writer for
`distill`, `evaluate` and the engine); this module rewrites it with the verifier set to the target and the weights in
`--dtype`, and validates it as vLLM 0.32 reads it:
- `SpeculatorsConfig.extract_transformers_pre_trained_config` (`transformers_utils/configs/speculators/base.py`):
  `transformer_layer_config` plus `update_dspark` (`.../speculators/algos.py`): `aux_hidden_state_layer_ids` required
  (target layers are `id - 1`), `mask_token_id`, `markov_rank`, `block_size`, `sample_from_anchor` (false means the
  fill-in layout, whose first slot predicts nothing: mtp2draft drafts anchor-first), architectures reduced to
  `Qwen3DSparkModel`;
- `extract_vllm_speculative_config`: `speculators_config.proposal_methods[0].speculative_tokens` is vLLM's
  `num_speculative_tokens`, the verifier's `name_or_path` is the target. vLLM 0.32 drafts a block of that many slots
  (`v1/worker/gpu/spec_decode/dspark/speculator.py`: anchor + N - 1 noise), so it must be the drafter's block size;
- weights (`model_executor/models/qwen3_dspark.py`, `Qwen3DSparkForCausalLM.load_weights`): every name gets `model.`
  and must be a parameter of `Qwen3DSparkModel` (fc, hidden_norm, Qwen3 layers, norm, markov_head,
  confidence_head.proj in fp32); without `embed_tokens` / `lm_head` the target's are shared.

What this module does not do: take a release's DSpark stages (DeepSeek-V4 blocks have no speculators layout: they are
written back with `--format stitched`, `formats/dspark_stitched.py`), or serve (vLLM 0.32's CPU build refuses DSpark:
docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.draft import dspark_disk as disk
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats.common import load_weights, nonfinite, required_value_problems, speculators_section_problems
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

VLLM_VERSION = "0.32"  # the release the reading above was checked against (its CPU build's source)
# what vLLM dispatches on (`SUPPORTED_SPECULATORS_TYPES`, `update_dspark`'s supported architectures)
REQUIRED = {"speculators_model_type": disk.MODEL_TYPE, "architectures": [disk.ARCHITECTURE]}
FP32 = "confidence_head."  # vLLM builds DSparkConfidenceHead in fp32 whatever the model dtype


def block_size(cfg: Mapping[str, Any]) -> int:
    """The drafter's block size: the `num_speculative_tokens` every launch line asks for."""
    return disk.fields_of(cfg).block_size


def _meta_draft(cfg: Mapping[str, Any]):
    """The drafter module on the meta device, as `config.json` describes it (no weights read)."""
    from transformers import Qwen3Config

    from mtp2draft.draft.dspark import DSparkDraft

    with torch.device("meta"):
        return DSparkDraft(Qwen3Config(**cfg["transformer_layer_config"]), disk.fields_of(cfg), confidence_bias=True)


def expected_shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Stored name -> shape of every tensor the directory must hold (the drafter's own; never embedding or head)."""
    return {k: tuple(v.shape) for k, v in disk.own_tensors(_meta_draft(cfg)).items()}


def _verifier(job: ExportJob) -> dict[str, Any]:
    """The target vLLM serves the drafter with: --verifier, else --target, else the one the drafter names; its
    architectures from its config when it is read."""
    old = (job.cfg.get("speculators_config") or {}).get("verifier") or {}
    name = job.config.verifier or job.target or old.get("name_or_path")
    if not name:
        raise DraftError("the drafter names no verifier: pass --target (the model it drafts for) or --verifier")
    architectures = list(old.get("architectures") or [])
    if job.target:
        from mtp2draft.checkpoint.reader import open_checkpoint

        target = open_checkpoint(job.target, job.hub.revision, job.hub.token).config
        _check_target(job.cfg, target, job.target)
        architectures = list(target.get("architectures") or architectures)
    return {"name_or_path": name, "architectures": architectures}


def _check_target(cfg: Mapping[str, Any], target: Mapping[str, Any], name: str) -> None:
    """The drafter shares the target's embedding and head and reads its layers: sizes and layer ids must fit."""
    layers, text = cfg["transformer_layer_config"], target.get("text_config") or target
    for key in ("hidden_size", "vocab_size"):
        if text.get(key) is not None and layers.get(key) != text[key]:
            raise DraftError(f"--target {name}: {key} {text[key]}, the drafter's is {layers.get(key)}: not its drafter")
    count = text.get("num_hidden_layers")
    beyond = [i for i in disk.fields_of(cfg).target_layer_ids if isinstance(count, int) and i >= count]
    if beyond:
        raise DraftError(f"--target {name} has {count} layers; the drafter reads layers {beyond}")


def _write(job: ExportJob) -> None:
    """The `write` of this format: fills job.out from the dspark directory job.src."""
    from safetensors.torch import load_file

    if not disk.is_speculators_dspark(job.cfg):
        raise DraftError(
            f"{job.src} holds a release's DSpark stages ({job.cfg.get('architectures')}): speculators' dspark type "
            f"builds Qwen3-style layers only (vLLM {VLLM_VERSION} update_dspark: Qwen3DSparkModel); write them back "
            "into the release with --format stitched --target RELEASE"
        )
    state = load_file(str(job.src / WEIGHTS_FILE))
    check_tensors(job.src / WEIGHTS_FILE, state)
    expected = expected_shapes(job.cfg)
    missing, unknown = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unknown:
        raise DraftError(f"{job.src}: model.safetensors does not match its config: missing {missing[:3]}, "
                         f"unknown {unknown[:3]}")  # fmt: skip
    wrong = [k for k, v in state.items() if tuple(v.shape) != expected[k]]
    if wrong:
        raise DraftError(f"{job.src}: {wrong[0]} is {list(state[wrong[0]].shape)}, its config implies "
                         f"{list(expected[wrong[0]])}")  # fmt: skip
    dtype = TORCH_DTYPES[job.config.dtype]
    tensors = {k: v.float() if k.startswith(FP32) else v.to(dtype) for k, v in sorted(state.items())}
    verifier = _verifier(job)
    block = block_size(job.cfg)
    if job.config.speculative_tokens != block:
        job.progress(f"note: vLLM drafts one block per step: num_speculative_tokens is the block size {block}")
    job.progress(f"writing {len(tensors)} tensors (speculators dspark layout, {job.config.dtype})")
    save_tensors(job.out / WEIGHTS_FILE, tensors, {"format": "pt"})
    out_cfg = disk.dspark_config(_meta_draft(job.cfg), verifier, job.config.dtype)
    if job.cfg.get("mtp2draft"):
        out_cfg["mtp2draft"] = job.cfg["mtp2draft"]
    write_json(job.out / CONFIG_FILE, out_cfg)
    job.record.update(dtype=job.config.dtype, speculative_tokens=block, verifier=verifier["name_or_path"])


def vllm_view(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the transformers config fields, the speculative config) vLLM 0.32 builds from a speculators dspark config:
    `extract_transformers_pre_trained_config` + `update_dspark`, then `extract_vllm_speculative_config`. KeyError or
    TypeError where vLLM's own reading would fail."""
    pre = dict(cfg["transformer_layer_config"])
    architectures = [a for a in cfg.get("architectures") or [] if a in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")]
    pre["architectures"] = architectures or [disk.ARCHITECTURE]
    pre["sample_from_anchor"] = cfg.get("sample_from_anchor", False)
    pre["dspark_bonus_anchor"] = not pre["sample_from_anchor"]
    aux = cfg["aux_hidden_state_layer_ids"]
    pre["eagle_aux_hidden_state_layer_ids"] = aux
    pre["target_layer_ids"] = [i - 1 for i in aux]
    for key in ("draft_vocab_size", "target_hidden_size", "mask_token_id", "markov_rank", "markov_head_type",
                "block_size", "enable_confidence_head", "confidence_head_with_markov", "use_aux_hidden_state"):  # fmt: skip
        if cfg.get(key) is not None:
            pre[key] = cfg[key]
    first = cfg["speculators_config"]["proposal_methods"][0]
    return pre, {"method": cfg["speculators_model_type"], "num_speculative_tokens": first["speculative_tokens"]}


def _config_problems(cfg: Mapping[str, Any]) -> list[str]:
    try:
        pre, spec = vllm_view(cfg)
    except (KeyError, TypeError, IndexError) as exc:
        return [f"vLLM {VLLM_VERSION} cannot read it as a dspark speculator: {type(exc).__name__} {exc}"]
    problems = []
    if not pre["sample_from_anchor"]:
        problems.append("sample_from_anchor is not true: vLLM would read the fill-in layout (slot 0 predicts nothing)")
    ids = pre["target_layer_ids"]
    if not ids or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids) or ids != sorted(set(ids)):
        problems.append(
            f"aux_hidden_state_layer_ids {cfg['aux_hidden_state_layer_ids']} must be strictly increasing ids >= 1"
        )
    vocab = pre.get("vocab_size")
    if (
        not isinstance(pre.get("mask_token_id"), int)
        or not isinstance(vocab, int)
        or not 0 <= pre["mask_token_id"] < vocab
    ):
        problems.append(f"mask_token_id {pre.get('mask_token_id')!r} is not a token id of the {vocab}-token vocabulary")
    for key in ("markov_rank", "block_size"):
        if not isinstance(pre.get(key), int) or isinstance(pre.get(key), bool) or pre[key] < 1:
            problems.append(f"{key} {pre.get(key)!r} must be a whole number >= 1")
    if not problems and spec["num_speculative_tokens"] != pre["block_size"]:
        problems.append(
            f"speculative_tokens {spec['num_speculative_tokens']} is not the block size {pre['block_size']}: vLLM "
            "drafts one block of num_speculative_tokens slots per step"
        )
    return problems


def _validate(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems = required_value_problems(cfg, REQUIRED, f"vLLM {VLLM_VERSION}")
    problems += speculators_section_problems(cfg, disk.MODEL_TYPE)
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        return [*problems, "transformer_layer_config is missing (vLLM builds the layers from it)"]
    problems += _config_problems(cfg)
    weights = load_weights(path, problems)
    if weights is None or problems:
        return problems
    try:
        expected = expected_shapes(cfg)
    except Exception as exc:
        return [f"cannot build the drafter from config.json: {exc}"]
    for name in sorted(set(expected) - set(weights)):
        problems.append(f"{name} is missing (vLLM would leave it at its initialisation)")
    for name in sorted(set(weights) - set(expected)):
        problems.append(f"{name} is not a parameter of vLLM's Qwen3DSparkModel as config.json builds it")
    want = TORCH_DTYPES.get(str(cfg.get("torch_dtype")))
    for name in sorted(set(weights) & set(expected)):
        t = weights[name]
        if tuple(t.shape) != expected[name]:
            problems.append(f"{name} has shape {list(t.shape)}, the config implies {list(expected[name])}")
        dtype = torch.float32 if name.startswith(FP32) else want
        if dtype is not None and t.dtype != dtype:
            problems.append(
                f"{name} is {str(t.dtype).removeprefix('torch.')}, expected {str(dtype).removeprefix('torch.')}"
            )
        if (msg := nonfinite(name, t)) is not None:
            problems.append(msg)
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
def launch_lines(target: str, draft: str, k: int) -> dict[str, str]:
    """k: the block size. vLLM reads the verifier and k from the directory; SGLang is given both."""
    return {
        "vLLM": f"vllm serve {target} --speculative-config "
        f'\'{{"method": "dspark", "model": "{draft}", "num_speculative_tokens": {k}}}\'',
        "SGLang": f"python -m sglang.launch_server --model {target} --speculative-algorithm DSPARK "
        f"--speculative-draft-model-path {draft} --speculative-dspark-block-size {k}",
    }


# No family spec lists dspark among an engine's methods, so `run` never picks it (`usable`).
PROVIDES: dict[str, Format] = {
    "speculators-dspark": Format(
        write=_write,
        validate=_validate,
        detect=lambda config: config.get("speculators_model_type") == disk.MODEL_TYPE,
        launch_lines=launch_lines,
        usable=lambda spec: False,
    ),
}
