"""The EAGLE-3 formats: `sglang` (SGLang's `LlamaForCausalLMEagle3` layout, also read by vLLM and TensorRT-LLM; aux
layer ids written twice: `eagle_config` in "output of layer i" terms, top level in vLLM's "input of layer i" terms)
and `speculators` (vLLM's `Eagle3Speculator`: the same weights with `midlayer.` renamed `layers.0.`, a
`transformer_layer_config`, the proposal method and verifier, and every norm switch written explicitly). Their
config codecs live in `draft/eagle3_config.py`; the contract is SGLang 0.5.23's `models/llama_eagle3.py` and vLLM
0.33's `model_executor/models/llama_eagle3.py` and speculators config reader (docs/formats.md).

Also the two formats' writer (`_export_eagle3`) and validators. What this module does not do: load a draft for
training or evaluation (`draft/modules.py`, which uses the codecs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.draft.eagle3 import VOCAB_MAPS, without_identity_maps
from mtp2draft.draft.eagle3_config import (
    LLAMA_FIELDS,
    NORM_SWITCHES,
    SGLANG_PREFIX,
    SPECULATORS_ARCHITECTURE,
    SPECULATORS_PREFIX,
    draft_spec_name,
    dtype_name,
    sglang_aux_ids,
    sglang_aux_rule,
    sglang_captured_outputs,
    sglang_config,
    speculators_config,
    speculators_to_eagle3_config,
    speculators_weight_name,
)
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.errors import DraftError
from mtp2draft.family.spec import get_spec
from mtp2draft.formats import ExportJob, Format
from mtp2draft.formats.common import (
    load_weights,
    nonfinite,
    required_value_problems,
    section,
    sglang_steps,
    speculators_section_problems,
)
from mtp2draft.kinds import CONFIG_FILE, EAGLE3_ARCHITECTURE, WEIGHTS_FILE, DraftKind
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.progress import Progress, quiet


def _eagle3_input(src: Path, cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(SGLang-layout config, SGLang-named tensors) of an EAGLE-3 draft directory in either layout."""
    from safetensors.torch import load_file

    weights = src / WEIGHTS_FILE
    if not weights.is_file():
        raise DraftError(f"{src} has no {WEIGHTS_FILE}")
    state = load_file(str(weights))
    check_tensors(weights, state)
    if cfg.get("speculators_model_type"):
        return speculators_to_eagle3_config(cfg), {speculators_weight_name(k): v for k, v in state.items()}
    return dict(cfg), state


def hub_id_of(source: str | None) -> str | None:
    """The hub repo id a source names: itself when it is one, the repo of a Hugging Face cache snapshot directory
    (`.../models--org--name/snapshots/<commit>`), else None (a plain local directory)."""
    if not source:
        return None
    path = Path(source)
    if not path.is_absolute() and not source.startswith((".", "~")) and source.count("/") == 1:
        return source
    for part in reversed(path.parts):
        if part.startswith("models--") and part.count("--") >= 2:
            return "/".join(part[len("models--") :].split("--", 1))
    return None


def verifier_of(
    cfg: Mapping[str, Any], provenance: Mapping[str, Any], name: str | None = None, progress: Progress = quiet
) -> dict[str, Any]:
    """The target (speculators' 'verifier', which `vllm serve DRAFT` loads): `name` when given, else the hub id the
    draft was converted from; a local directory is written as it is, with a note (it only serves on this machine).
    Architectures come from the spec."""
    meta = cfg.get("mtp2draft") or {}
    source = provenance.get("source") or meta.get("source")
    if not name:
        name = hub_id_of(source) or source
        if name and name == source and hub_id_of(source) is None:
            progress(
                f"note: the verifier is the local directory {source}; pass --verifier HUB_ID so that "
                "`vllm serve DRAFT` finds the target elsewhere"
            )
    spec_name = meta.get("spec") or provenance.get("spec")
    architectures: list[str] = []
    if spec_name:
        spec = get_spec(spec_name)
        architectures = list(spec.architectures[:1])
    return {"name_or_path": name, "architectures": architectures}


def _export_eagle3(job: ExportJob) -> None:
    """The sglang or speculators layout of an EAGLE-3 draft, in `job.config`'s dtype, k and verifier."""
    job.record["dtype"] = job.config.dtype
    tmp, format, progress, dtype = job.out, job.format, job.progress, TORCH_DTYPES[job.config.dtype]
    eagle_cfg, state = _eagle3_input(job.src, job.cfg)
    if format == "sglang":
        out_cfg, prefix = sglang_config(eagle_cfg, dtype), SGLANG_PREFIX
    else:
        verifier = verifier_of(eagle_cfg, job.provenance, job.config.verifier, progress)
        out_cfg = speculators_config(eagle_cfg, dtype, job.config.speculative_tokens, verifier)
        prefix = SPECULATORS_PREFIX
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        if name == "embed_tokens.weight":  # engines share the target's embedding
            continue
        tensor = state[name]
        if name == "d2t":
            tensor = tensor.to(torch.int64)
        elif name == "t2d":
            tensor = tensor.to(torch.bool)
        elif tensor.is_floating_point():
            tensor = tensor.to(dtype)
        out_name = prefix + name[len(SGLANG_PREFIX) :] if name.startswith(SGLANG_PREFIX) else name
        tensors[out_name] = tensor
    vocab = int(eagle_cfg["vocab_size"])
    tensors = without_identity_maps(tensors, vocab, int(eagle_cfg.get("draft_vocab_size") or vocab))
    progress(f"writing {len(tensors)} tensors ({format} layout, {dtype_name(dtype)})")
    save_tensors(tmp / WEIGHTS_FILE, tensors, {"format": "pt"})
    write_json(tmp / CONFIG_FILE, out_cfg)


# the values each layout's loader builds the draft from (its class, its config type): config.json must hold them
SGLANG_REQUIRED = {"architectures": [EAGLE3_ARCHITECTURE], "model_type": "llama"}
SPECULATORS_REQUIRED = {"architectures": [SPECULATORS_ARCHITECTURE], "speculators_model_type": DraftKind.EAGLE3.value}


def _validate_sglang(path: Path, cfg: dict[str, Any]) -> list[str]:
    """The sglang layout's contract. Every field's type, range and enumeration (hidden_act, aux id lists) is the
    draft config's (`draft_config.parse_draft_config`, which `export.validate` runs first)."""
    problems: list[str] = []
    problems += required_value_problems(cfg, SGLANG_REQUIRED, "SGLang")
    if cfg.get("num_hidden_layers") != 1:
        problems.append(f"num_hidden_layers is {cfg.get('num_hidden_layers')}, the EAGLE-3 draft has 1 layer")
    if cfg.get("tie_word_embeddings"):
        problems.append("tie_word_embeddings is true: SGLang would use the target's embedding as the draft's lm_head")
    problems += _llama_problems(cfg, "")
    if cfg.get("draft_vocab_size") is None:
        problems.append("draft_vocab_size is missing: SGLang would load the target's full lm_head instead of ours")
    eagle = cfg.get("eagle_config")
    inner = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not inner:
        problems.append(
            "eagle_config.eagle_aux_hidden_state_layer_ids is missing: SGLang would capture its default layers "
            "[2, N//2, N-3], not the ones the draft was trained on"
        )
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state is false: the engines would skip fc")
    top_problems = _vllm_ids_problems(
        top,
        "top-level eagle_aux_hidden_state_layer_ids",
        " (or read eagle_config's 'output of layer' ids as 'input of layer' ids, one layer early)",
    )
    problems += top_problems
    if not top_problems and _ids_ok(top, 1) and inner and _ids_ok(inner, 0):
        # Both copies must select the layers the draft was trained on: vLLM captures the input of each top-level
        # id (= the output of id - 1); SGLang reads eagle_config by the target family's rule (`[engines.sglang]
        # aux_ids`: + 1 always for Llama / Qwen / GLM, + 1 only when the first id is 1 for DeepSeek).
        spec_name = draft_spec_name(cfg)
        rule = sglang_aux_rule(spec_name)
        trained = [int(i) - 1 for i in top]
        sglang_reads = sglang_captured_outputs([int(i) for i in inner], rule)
        if sglang_reads != trained:
            want = sglang_aux_ids(trained, rule)
            family = f"a {spec_name} target" if spec_name else "this target"
            fix = (
                f"eagle_config needs {want}"
                if want is not None
                else "no eagle_config ids can say so (serve it with vLLM, or convert with --aux-layers starting at 1)"
            )
            problems.append(
                f"aux ids disagree: vLLM reads top-level {list(top)} as the outputs of layers {trained}; SGLang reads "
                f"eagle_config {list(inner)} for {family} ({rule}) as the outputs of layers {sglang_reads}: {fix}"
            )
    weights = load_weights(path, problems)
    if weights is not None:
        problems += _eagle3_weight_problems(cfg, weights, SGLANG_PREFIX, int(cfg.get("vocab_size") or 0))
    return problems


def _int(value: Any) -> Any:
    return int(value) if isinstance(value, int | float) else value


def _vllm_ids_problems(ids: Any, name: str, missing_why: str) -> list[str]:
    """What is wrong with the aux ids vLLM reads ('input of layer i', so >= 1) under config field `name`."""
    if not ids:
        return [f"{name} is missing: vLLM would capture its default layers{missing_why}"]
    return []  # their form (three distinct ids >= 1, 'input of layer i') is the draft config's (`draft_config`)


def _ids_ok(ids: Any, minimum: int) -> bool:
    return (
        isinstance(ids, list)
        and len(ids) == 3
        and all(isinstance(i, int) and i >= minimum for i in ids)
        and len(set(ids)) == 3
    )


def _llama_problems(cfg: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    for key in (*LLAMA_FIELDS, "vocab_size"):
        if key not in cfg:
            problems.append(f"{where}{key} is missing")
    try:
        h, heads, kv = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    except (KeyError, TypeError, ValueError):
        return problems
    if heads <= 0 or h % heads:  # transformers' LlamaConfig (which the engines parse configs with) rejects it
        problems.append(f"{where}hidden_size {h} is not a multiple of num_attention_heads {heads}")
    if kv <= 0 or heads % kv:
        problems.append(f"{where}num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return problems


def _eagle3_shapes(cfg: Mapping[str, Any], layer: Mapping[str, Any], prefix: str) -> dict[str, tuple[int, ...]] | None:
    try:
        h, heads, kv = int(layer["hidden_size"]), int(layer["num_attention_heads"]), int(layer["num_key_value_heads"])
        hd = int(layer.get("head_dim") or h // heads)
        inter, v = int(layer["intermediate_size"]), int(layer["vocab_size"])
        vd, ht = int(cfg.get("draft_vocab_size") or v), int(cfg.get("target_hidden_size") or h)
    except (KeyError, TypeError, ValueError):
        return None
    a = prefix + "self_attn."
    return {
        "fc.weight": (h, 3 * ht),
        prefix + "input_layernorm.weight": (h,),
        prefix + "hidden_norm.weight": (h,),
        prefix + "post_attention_layernorm.weight": (h,),
        a + "q_proj.weight": (heads * hd, 2 * h),
        a + "k_proj.weight": (kv * hd, 2 * h),
        a + "v_proj.weight": (kv * hd, 2 * h),
        a + "o_proj.weight": (h, heads * hd),
        prefix + "mlp.gate_proj.weight": (inter, h),
        prefix + "mlp.up_proj.weight": (inter, h),
        prefix + "mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
        # the vocabulary maps exist only for a reduced draft vocabulary (see `draft.without_identity_maps`)
        **({"d2t": (vd,), "t2d": (v,)} if vd != v else {}),
    }


def _eagle3_weight_problems(
    cfg: Mapping[str, Any], weights: Mapping[str, torch.Tensor], prefix: str, vocab: int, layer_cfg=None
) -> list[str]:
    problems: list[str] = []
    layer_cfg = cfg if layer_cfg is None else layer_cfg
    expected = _eagle3_shapes(cfg, layer_cfg, prefix)
    if "embed_tokens.weight" in weights:
        problems.append(
            "embed_tokens.weight is present: the EAGLE-3 layout leaves the embedding out (engines share the target's)"
        )
    if expected is not None:
        for name in expected:
            if name not in weights:
                problems.append(f"{name} is missing (the engines would load the draft without it and accept ~nothing)")
        for name in sorted(set(weights) - set(expected) - {"embed_tokens.weight"}):
            if name in VOCAB_MAPS:
                problems.append(
                    f"{name} is present but draft_vocab_size equals vocab_size ({int(layer_cfg['vocab_size'])}): "
                    "vLLM 0.32 refuses to load a full-vocabulary EAGLE-3 draft that carries d2t/t2d "
                    "(it has no draft_id_to_target_id parameter then); drop both"
                )
                continue
            other = SPECULATORS_PREFIX if prefix == SGLANG_PREFIX else SGLANG_PREFIX
            hint = (
                f" (the {'speculators' if other == SPECULATORS_PREFIX else 'SGLang'} name)"
                if name.startswith(other)
                else ""
            )
            problems.append(f"{name} is not a tensor of this layout{hint}")
        h = int(layer_cfg["hidden_size"])
        for name, want in expected.items():
            if name not in weights or tuple(weights[name].shape) == want:
                continue
            got = tuple(weights[name].shape)
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) and len(got) == 2 and got[1] == h:
                problems.append(
                    f"{name} reads H={h} inputs; EAGLE-3's q/k/v read [embed, hidden], 2H={2 * h} (shape "
                    f"{list(got)}, expected {list(want)})"
                )
            elif name == "fc.weight":
                problems.append(
                    f"fc.weight is {list(got)}; it fuses three target layers: [hidden_size, 3 * target_hidden_size]"
                    f" = {list(want)}"
                )
            else:
                problems.append(f"{name} has shape {list(got)}, the config implies {list(want)}")
    want_dtype = TORCH_DTYPES.get(str(cfg.get("torch_dtype")))
    floats = {n: t.dtype for n, t in weights.items() if n not in ("d2t", "t2d") and t.is_floating_point()}
    for name, t in weights.items():
        if name in ("d2t", "t2d"):
            continue
        if not t.is_floating_point():
            continue  # `nonfinite` below names it, as every reader does
        if want_dtype is not None and t.dtype != want_dtype:
            problems.append(
                f"{name} is {dtype_name(t.dtype)} but config.json says torch_dtype {cfg.get('torch_dtype')}"
            )
    if want_dtype is None and len(set(floats.values())) > 1:
        problems.append(f"weights mix dtypes {sorted({dtype_name(d) for d in floats.values()})}")
    for name, t in weights.items():
        if name not in ("d2t", "t2d") and (msg := nonfinite(name, t)) is not None:  # the maps: `_vocab_problems`
            problems.append(msg)
    problems += _vocab_problems(weights, vocab, int(cfg.get("draft_vocab_size") or 0))
    return problems


def _vocab_problems(weights: Mapping[str, torch.Tensor], vocab: int, draft_vocab: int) -> list[str]:
    """d2t int64 [Vd] (target = draft id + d2t[draft id], inside [0, V), strictly increasing) and t2d bool [V]
    marking exactly those targets."""
    problems: list[str] = []
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is not None and d2t.dtype != torch.int64:
        problems.append(f"d2t is {dtype_name(d2t.dtype)}, engines expect int64")
    if t2d is not None and t2d.dtype != torch.bool:
        problems.append(f"t2d is {dtype_name(t2d.dtype)}, expected bool")
    if t2d is not None and vocab and tuple(t2d.shape) != (vocab,):
        problems.append(f"t2d has shape {list(t2d.shape)}, expected [{vocab}] (the target's vocab_size)")
    if d2t is None or d2t.dim() != 1 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        return problems
    if draft_vocab and d2t.numel() != draft_vocab:
        problems.append(f"d2t has {d2t.numel()} entries, expected draft_vocab_size={draft_vocab}")
    targets = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)
    outside = ((targets < 0) | (targets >= vocab)) if vocab else targets < 0
    if outside.any():
        bad = torch.nonzero(outside).flatten()[:5].tolist()
        problems.append(
            f"d2t maps {int(outside.sum())} draft ids outside the target vocabulary [0, {vocab}) "
            f"(draft ids {bad} -> {targets[bad].tolist()})"
        )
    if targets.numel() > 1 and not bool((targets[1:] > targets[:-1]).all()):
        problems.append("d2t's target ids are not strictly increasing (the draft vocabulary must be sorted, unique)")
    if t2d is not None and t2d.dim() == 1 and not outside.any():
        marks = t2d.to(torch.bool)
        if targets.numel() and int(targets.max()) >= marks.numel():
            return problems
        unmarked = int((~marks[targets]).sum())
        extra = int(marks.sum()) - int(marks[targets].sum())
        if unmarked or extra:
            problems.append(
                f"t2d disagrees with d2t: {unmarked} draft targets not marked in t2d, {extra} marked ids not in d2t"
            )
    return problems


def _validate_speculators(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    problems += required_value_problems(cfg, SPECULATORS_REQUIRED)
    if not cfg.get("speculators_version"):
        problems.append("speculators_version is missing")
    problems += speculators_section_problems(cfg, DraftKind.EAGLE3)
    layer = section(cfg, "transformer_layer_config", " (vLLM refuses the config)", problems)
    if layer is None:
        layer = {}
    else:
        if layer.get("model_type") != "llama":
            problems.append(
                f"transformer_layer_config.model_type is {layer.get('model_type')!r}; vLLM builds "
                "Eagle3LlamaForCausalLM from 'llama'"
            )
        problems += _llama_problems(layer, "transformer_layer_config.")
        if layer.get("num_hidden_layers", 1) != 1:
            problems.append("transformer_layer_config.num_hidden_layers must be 1")
    for key in ("draft_vocab_size", "target_hidden_size"):
        if cfg.get(key) is None:
            problems.append(f"{key} is missing")
    problems += _vllm_ids_problems(
        cfg.get("eagle_aux_hidden_state_layer_ids"),
        "eagle_aux_hidden_state_layer_ids",
        ", not the ones the draft was trained on",
    )
    for key, want in NORM_SWITCHES.items():
        if key not in cfg:
            default = " (vLLM then assumes true)" if key == "norm_before_residual" else ""
            problems.append(f"{key} is not written explicitly{default}; mtp2draft's EAGLE-3 needs {key}={want}")
        elif cfg[key] is not want:
            problems.append(f"{key} is {cfg[key]!r}; mtp2draft's EAGLE-3 computation needs {want}")
    weights = load_weights(path, problems)
    if weights is not None:
        vocab = int(layer.get("vocab_size") or 0)
        merged = {**layer, **{k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size") if k in cfg}}
        merged["torch_dtype"] = cfg.get("torch_dtype") or layer.get("torch_dtype")
        problems += _eagle3_weight_problems(merged, weights, SPECULATORS_PREFIX, vocab, layer)
    return problems


# ---- registration ---------------------------------------------------------------------------------------------------
def _is_speculators(config: Mapping[str, Any]) -> bool:
    # speculators' other types (`mtp`: formats/speculators_mtp.py) are other formats
    kind = config.get("speculators_model_type")
    return kind == DraftKind.EAGLE3 or (not kind and SPECULATORS_ARCHITECTURE in (config.get("architectures") or []))


def _is_sglang(config: Mapping[str, Any]) -> bool:
    return EAGLE3_ARCHITECTURE in (config.get("architectures") or [])


def _launch_lines(fmt: str) -> Callable[[str, str, int], dict[str, str]]:
    def lines(target: str, draft: str, k: int) -> dict[str, str]:
        out = {
            "SGLang": f"python -m sglang.launch_server --model {target} --speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {draft} {sglang_steps(k)}",
            "vLLM": f"vllm serve {target} --speculative-config "
            f'\'{{"method": "eagle3", "model": "{draft}", "num_speculative_tokens": {k}}}\'',
        }
        if fmt == "speculators":  # the config names the verifier and k: vLLM needs nothing else
            out["vLLM (speculators config)"] = f"vllm serve {draft}"
        return out

    return lines


def _format(name: str, engine: str, validate: Any, detect: Any, codec: Any) -> Format:
    """The two EAGLE-3 formats share the writer and the launch lines; `engine` is the one that serves the format."""
    return Format(
        write=_export_eagle3,
        validate=validate,
        detect=detect,
        launch_lines=_launch_lines(name),
        usable=lambda spec: spec.serves(engine, DraftKind.EAGLE3),
        codec=codec,
    )


PROVIDES: dict[str, Format] = {
    "sglang": _format("sglang", "sglang", _validate_sglang, _is_sglang, sglang_config),
    "speculators": _format("speculators", "vllm", _validate_speculators, _is_speculators, speculators_config),
}
