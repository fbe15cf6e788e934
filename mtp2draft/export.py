"""Stage 4a: draft directory -> the files a serving engine loads, and the validators that check them.

Formats (`FORMATS`, each for one draft kind; `../shared/reference/draft-formats.md` is the contract):
- `sglang` (EAGLE-3): SGLang's `LlamaForCausalLMEagle3` layout, also read by vLLM and TensorRT-LLM. Aux layer ids
  written twice: `eagle_config` in "output of layer i" terms (SGLang captures before layer i + 1), top level in
  vLLM's "input of layer i" terms (the same ids + 1).
- `speculators` (EAGLE-3): vLLM's native format (`Eagle3Speculator`): the same weights with `midlayer.` renamed
  `layers.0.`, a `transformer_layer_config`, the proposal method and verifier, and every norm switch written
  explicitly with the values that reproduce mtp2draft's EAGLE-3 computation (`NORM_SWITCHES`).
- `nextn` (native MTP): a standalone NextN checkpoint for SGLang: the layer renumbered to 0 under the family's own
  key names, no embedding or head, `num_hidden_layers: 1`, the spec's `[nextn]` architecture; FP8 where the target
  shipped the layer in FP8 (SGLang's `export_deepseek_nextn.py` copies tensors in their stored dtype).
- `stitched` (native MTP): the fine-tuned layer written back under the target's key names, dtypes and quantization,
  as an overlay: only the shards holding MTP keys (their other tensors unchanged), the index, the target's
  config.json and a README saying how to lay the files over the target (vLLM's `method: "mtp"` then loads it).

Every exporter writes into a temporary sibling directory, runs `validate` on it, and renames it into place only
when the validator finds nothing: a violation raises `ValidationError` (listing them all) and nothing is written.
`validate` is the same function the `validate` command runs on any directory (format detected from config.json).

What this module does not do: train, evaluate or convert checkpoints (it reads draft directories written by
`convert` / `distill`), or talk to the Hub beyond reading a `--target` checkpoint (`hub.py` publishes).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .checkpoint import DTYPES as ST_DTYPES
from .checkpoint import INDEX_FILE, SCALE_SUFFIX, Checkpoint, open_checkpoint, quantize_fp8
from .draft import (
    CONFIG_FILE,
    PROVENANCE_FILE,
    VOCAB_MAPS,
    WEIGHTS_FILE,
    NativeMtpDraft,
    read_draft_config,
    without_identity_maps,
)
from .errors import DraftError, SourceError, ValidationError
from .io import Progress, SafetensorsWriter, atomic_output_dir, check_output_dir, quiet, save_tensors, write_json
from .spec import Spec, find_spec, get_spec

# format -> the draft kind it takes (`mtp2draft export --format` choices come from here)
FORMATS: dict[str, str] = {"sglang": "eagle3", "speculators": "eagle3", "nextn": "mtp", "stitched": "mtp"}
# `validate` also knows mtp2draft's own native draft directory (`convert --to mtp`, `distill`).
VALIDATE_FORMATS = (*FORMATS, "mtp")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EVALUATION_FILE = "evaluation.json"
README_FILE = "README.md"

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
# The speculators release whose `Eagle3SpeculatorConfig` schema (norm_before_fc, fc_norm, norm_output) we checked.
# Informational: neither vLLM nor speculators compares it with anything.
SPECULATORS_VERSION = "0.7.0"
# vLLM's `update_eagle3` (vllm/transformers_utils/configs/speculators/algos.py) defaults norm_before_residual to
# TRUE when the key is missing; the others default to false. Our EAGLE-3 layer (draft.Eagle3Layer, SGLang's
# midlayer) keeps the UN-normalised fc output as the residual (norm_before_residual false), feeds fc the raw
# captured states (norm_before_fc false: no RMSNorm over the concatenation; fc_norm false: no per-layer norms) and
# hands the PRE-norm output to the next step (norm_output false). Written explicitly, every one.
NORM_SWITCHES: dict[str, bool] = {
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
}
# Llama fields every EAGLE-3 config carries (config.json of the sglang layout, transformer_layer_config).
LLAMA_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "hidden_act",
)
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
SGLANG_PREFIX, SPECULATORS_PREFIX = "midlayer.", "layers.0."
# Tensors of a shard being rewritten are copied in runs of about this many bytes (peak memory per run).
COPY_RUN_BYTES = 256 * 2**20


@dataclass
class ExportResult:
    out: Path
    format: str
    files: list[str]
    seconds: float
    provenance: dict[str, Any] = field(default_factory=dict)


# ---- the stage --------------------------------------------------------------------------------------------------
def export(
    draft: str | Path,
    format: str,
    out: str | Path,
    target: str | None = None,
    overwrite: bool = False,
    dtype: str = "bfloat16",
    speculative_tokens: int = 3,
    revision: str | None = None,
    token: str | bool | None = None,
    progress: Progress = quiet,
) -> ExportResult:
    """Write draft directory `draft` in engine format `format` to `out` (validated before it appears).

    dtype: weights dtype of the EAGLE-3 formats (`float32` for a bit-exact copy of an fp32 draft). The native formats
    keep the target's own dtypes and quantization instead. target: the target checkpoint (hub id or local dir);
    required by `stitched`, optional for `nextn` (its dtypes and FP8 layout then come from the target's headers
    rather than the draft's provenance). speculative_tokens: k written into the speculators proposal method.
    """
    if format not in FORMATS:
        raise SourceError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if dtype not in DTYPES:
        raise SourceError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if speculative_tokens < 1:
        raise SourceError(f"--speculative-tokens must be at least 1, got {speculative_tokens}")
    src = Path(draft)
    cfg = read_draft_config(src)
    kind = _input_kind(cfg)
    if FORMATS[format] != kind:
        other = [f for f, k in FORMATS.items() if k == kind]
        raise DraftError(
            f"--format {format} takes {'an EAGLE-3' if FORMATS[format] == 'eagle3' else 'a native MTP'} draft; "
            f"{src} is {'an EAGLE-3' if kind == 'eagle3' else 'a native MTP'} draft (use --format {' or '.join(other)})"
        )
    if format == "stitched" and not target:
        raise SourceError("--format stitched needs --target: the checkpoint whose MTP layer the draft replaces")
    check_output_dir(out, overwrite)
    started = time.perf_counter()
    provenance = _read_json(src / PROVENANCE_FILE) or {}
    record: dict[str, Any] = {
        "format": format,
        "from": str(src),
        "version": __version__,
        "command": " ".join(sys.argv) if sys.argv else "",
    }
    with atomic_output_dir(out, overwrite) as tmp:
        if format in ("sglang", "speculators"):
            record["dtype"] = dtype
            _export_eagle3(src, cfg, tmp, format, DTYPES[dtype], speculative_tokens, provenance, progress)
        elif format == "nextn":
            _export_nextn(src, cfg, tmp, provenance, record, target, revision, token, progress)
        else:
            _export_stitched(src, cfg, tmp, provenance, record, target, revision, token, progress)  # type: ignore[arg-type]
        if (src / EVALUATION_FILE).is_file():  # `push` puts the measured acceptance on the model card
            shutil.copyfile(src / EVALUATION_FILE, tmp / EVALUATION_FILE)
        provenance = {**provenance, "export": record}
        write_json(tmp / PROVENANCE_FILE, provenance)
        progress(f"validating the {format} export")
        violations = validate(tmp, format)
        if violations:
            more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
            raise ValidationError(
                f"the {format} export of {src} violates its format ({len(violations)}): "
                + "; ".join(violations[:3])
                + more,
                violations,
            )
        files = sorted(p.name for p in tmp.iterdir())
    return ExportResult(Path(out), format, files, time.perf_counter() - started, provenance)


def _input_kind(cfg: Mapping[str, Any]) -> str:
    if cfg.get("draft_kind") == "mtp":
        return "mtp"
    if EAGLE3_ARCHITECTURE in (cfg.get("architectures") or []) or cfg.get("speculators_model_type") == "eagle3":
        return "eagle3"
    raise DraftError(
        "config.json describes neither an mtp2draft native MTP draft nor an EAGLE-3 draft "
        "(export reads directories written by `convert` or `distill`)"
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DraftError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else None


# ---- EAGLE-3: sglang and speculators ------------------------------------------------------------------------------
def speculators_to_eagle3_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A speculators `Eagle3Speculator` config.json -> the SGLang-layout EAGLE-3 config mtp2draft's modules use.

    Refuses configs whose norm switches ask for a computation other than mtp2draft's EAGLE-3 layer (a missing
    `norm_before_residual` counts as true, as vLLM reads it)."""
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, Mapping):
        raise DraftError("speculators config.json has no transformer_layer_config")
    switches = {k: bool(cfg.get(k, k == "norm_before_residual")) for k in NORM_SWITCHES}
    if switches != NORM_SWITCHES:
        wrong = ", ".join(f"{k}={v}" for k, v in switches.items() if v != NORM_SWITCHES[k])
        raise DraftError(f"speculators draft computes a different EAGLE-3 variant ({wrong}); mtp2draft cannot load it")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise DraftError("speculators config.json has no eagle_aux_hidden_state_layer_ids")
    out: dict[str, Any] = {"architectures": [EAGLE3_ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1}
    out.update({k: layer[k] for k in (*LLAMA_FIELDS, "vocab_size", *TOKEN_FIELDS) if k in layer})
    out["draft_vocab_size"] = cfg.get("draft_vocab_size") or layer.get("vocab_size")
    out["target_hidden_size"] = cfg.get("target_hidden_size") or layer.get("hidden_size")
    out["tie_word_embeddings"] = False
    out["torch_dtype"] = cfg.get("torch_dtype") or layer.get("torch_dtype") or "bfloat16"
    out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [int(i) - 1 for i in ids], "use_aux_hidden_state": True}
    out["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids]
    for key in ("mtp2draft", "mtp2draft_init"):
        if key in cfg:
            out[key] = cfg[key]
    return out


def speculators_weight_name(name: str) -> str:
    """speculators weight name -> SGLang-layout name (`layers.0.` -> `midlayer.`)."""
    return SGLANG_PREFIX + name[len(SPECULATORS_PREFIX) :] if name.startswith(SPECULATORS_PREFIX) else name


def _eagle3_input(src: Path, cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(SGLang-layout config, SGLang-named tensors) of an EAGLE-3 draft directory in either layout."""
    from safetensors.torch import load_file

    weights = src / WEIGHTS_FILE
    if not weights.is_file():
        raise DraftError(f"{src} has no {WEIGHTS_FILE}")
    state = load_file(str(weights))
    if cfg.get("speculators_model_type"):
        return speculators_to_eagle3_config(cfg), {speculators_weight_name(k): v for k, v in state.items()}
    return dict(cfg), state


def _aux_ids(cfg: Mapping[str, Any]) -> list[int]:
    """The aux layer ids a draft was trained on ('output of layer i'), checked against the top-level copy."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids or len(ids) != 3:
        raise DraftError("the draft's config.json has no eagle_config.eagle_aux_hidden_state_layer_ids (three ids)")
    ids = [int(i) for i in ids]
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if top is not None and [int(i) for i in top] != [i + 1 for i in ids]:
        raise DraftError(
            f"the draft's aux ids disagree: eagle_config {ids} ('output of layer') vs top level {list(top)} "
            "('input of layer', expected each + 1); fix the draft before exporting"
        )
    return ids


def _llama_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    missing = [k for k in LLAMA_FIELDS if k not in cfg and k not in ("head_dim", "rope_scaling")]
    if missing or "vocab_size" not in cfg:
        raise DraftError(f"the draft's config.json lacks {', '.join(missing or ['vocab_size'])}")
    out = {k: cfg.get(k) for k in LLAMA_FIELDS}
    if out["head_dim"] is None:
        out["head_dim"] = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    out["hidden_act"] = cfg.get("hidden_act", "silu")
    return out


def sglang_config(cfg: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json of the SGLang `LlamaForCausalLMEagle3` layout from an EAGLE-3 draft config."""
    ids = _aux_ids(cfg)
    out: dict[str, Any] = {
        "architectures": [EAGLE3_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **_llama_fields(cfg),
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": int(cfg["vocab_size"]),
        # SGLang: draft_vocab_size None means "load lm_head from the target": always explicit.
        "draft_vocab_size": int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
        "target_hidden_size": int(cfg.get("target_hidden_size") or cfg["hidden_size"]),
        # SGLang ties lm_head to the embedding when true: our lm_head is the draft's own.
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(dtype),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids],
    }
    out.update({k: cfg[k] for k in TOKEN_FIELDS if k in cfg})
    out.update({k: cfg[k] for k in ("mtp2draft", "mtp2draft_init") if k in cfg})
    return out


def speculators_config(
    cfg: Mapping[str, Any], dtype: torch.dtype, speculative_tokens: int, verifier: Mapping[str, Any]
) -> dict[str, Any]:
    """config.json of vLLM's speculators `Eagle3Speculator` format from an EAGLE-3 draft config."""
    ids = _aux_ids(cfg)
    layer = {
        "model_type": "llama",  # vLLM's update_eagle3 picks Eagle3LlamaForCausalLM from this
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        **_llama_fields(cfg),
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": int(cfg["vocab_size"]),  # the TARGET's vocabulary (t2d's length)
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(dtype),
    }
    layer.update({k: cfg[k] for k in TOKEN_FIELDS if k in cfg})
    out: dict[str, Any] = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier.get("name_or_path"), "architectures": verifier["architectures"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
        "target_hidden_size": int(cfg.get("target_hidden_size") or cfg["hidden_size"]),
        # speculators / vLLM read 'input of layer i' ids, top level only
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids],
        **NORM_SWITCHES,
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(dtype),
    }
    out.update({k: cfg[k] for k in ("mtp2draft", "mtp2draft_init") if k in cfg})
    return out


def _verifier(cfg: Mapping[str, Any], provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The target (speculators' 'verifier'): name from the draft's provenance, architectures from its spec."""
    meta = cfg.get("mtp2draft") or {}
    name = provenance.get("source") or meta.get("source")
    spec_name = meta.get("spec") or provenance.get("spec")
    architectures: list[str] = []
    if spec_name:
        spec = get_spec(spec_name)
        architectures = list(spec.architectures[:1])
    return {"name_or_path": name, "architectures": architectures}


def _export_eagle3(
    src: Path,
    cfg: Mapping[str, Any],
    tmp: Path,
    format: str,
    dtype: torch.dtype,
    speculative_tokens: int,
    provenance: Mapping[str, Any],
    progress: Progress,
) -> None:
    eagle_cfg, state = _eagle3_input(src, cfg)
    if format == "sglang":
        out_cfg, prefix = sglang_config(eagle_cfg, dtype), SGLANG_PREFIX
    else:
        verifier = _verifier(eagle_cfg, provenance)
        out_cfg = speculators_config(eagle_cfg, dtype, speculative_tokens, verifier)
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
    progress(f"writing {len(tensors)} tensors ({format} layout, {_dtype_name(dtype)})")
    save_tensors(tmp / WEIGHTS_FILE, tensors, {"format": "pt"})
    write_json(tmp / CONFIG_FILE, out_cfg)


# ---- native MTP: nextn and stitched -------------------------------------------------------------------------------
def _num_layers_field(spec: Spec) -> str:
    return getattr(spec.config, "num_layers", "num_hidden_layers")


def _with_text_fields(spec: Spec, config: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """A copy of `config` with `fields` set in its (possibly nested) text config."""
    out = copy.deepcopy(dict(config))
    text = out[spec.config.text_config] if spec.config.text_config else out
    text.update(fields)
    return out


class NativeLayer:
    """A native draft's weights seen under checkpoint key names, one module tensor in memory at a time.

    The module -> checkpoint key map comes from `native_to_checkpoint` applied to meta tensors (no bytes read); a
    tensor is read and split (e.g. fused experts -> per-expert keys) when first asked for, and the last two module
    tensors are kept (a shard interleaves the gate_up and down pieces of consecutive experts)."""

    def __init__(self, weights: Path, spec: Spec, config: Mapping[str, Any], layer: int) -> None:
        from safetensors import safe_open

        from .convert import native_to_checkpoint

        self.spec, self.config, self.layer = spec, dict(config), layer
        self._to_checkpoint = native_to_checkpoint
        self._fh = safe_open(str(weights), framework="pt")
        self.module_of: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for module_key in self._fh.keys():  # noqa: SIM118 - safe_open is not a mapping
            meta = torch.empty(self._fh.get_slice(module_key).get_shape(), device="meta")
            for ckpt_key, t in native_to_checkpoint(spec, self.config, layer, {module_key: meta}).items():
                self.module_of[ckpt_key] = module_key
                self.shapes[ckpt_key] = tuple(t.shape)
        self._cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()

    def checkpoint_keys(self) -> list[str]:
        return list(self.module_of)

    def get(self, ckpt_key: str) -> torch.Tensor:
        """The tensor stored under `ckpt_key` (fp32 for floating tensors)."""
        module_key = self.module_of[ckpt_key]
        if module_key not in self._cache:
            tensor = self._fh.get_tensor(module_key)
            tensor = tensor.float() if tensor.is_floating_point() else tensor
            self._cache[module_key] = self._to_checkpoint(self.spec, self.config, self.layer, {module_key: tensor})
            while len(self._cache) > 2:
                self._cache.popitem(last=False)
        self._cache.move_to_end(module_key)
        return self._cache[module_key][ckpt_key]


def _native_input(src: Path, cfg: Mapping[str, Any]) -> tuple[Spec, dict[str, Any], int]:
    if not (src / WEIGHTS_FILE).is_file():
        raise DraftError(f"{src} has no {WEIGHTS_FILE}")
    try:
        return get_spec(cfg["spec"]), dict(cfg["target_config"]), int(cfg.get("mtp_layer", 0))
    except KeyError as exc:
        raise DraftError(f"{src}/{CONFIG_FILE} lacks {exc} (not a native draft written by convert/distill?)") from exc


def _open_target(target: str, spec: Spec, target_config: Mapping[str, Any], revision, token) -> Checkpoint:
    """The target checkpoint, checked to be the family and shape the draft was converted from."""
    ckpt = open_checkpoint(target, revision, token)
    found = find_spec(ckpt.config)
    if found.name != spec.name:
        raise DraftError(f"--target {target} is a {found.name} checkpoint; the draft is a {spec.name} MTP layer")
    mine, theirs = spec.text_config(target_config), spec.text_config(ckpt.config)
    for key in ("hidden_size", _num_layers_field(spec), "vocab_size", spec.config.mtp_count):
        if key in mine and mine.get(key) != theirs.get(key):
            raise DraftError(
                f"--target {target} has {key}={theirs.get(key)}, the draft was converted from a checkpoint with "
                f"{key}={mine.get(key)}: not the draft's target"
            )
    return ckpt


@dataclass(frozen=True)
class _Stored:
    """How the target stores one checkpoint tensor: dtype, and for FP8 the scale's key, dtype and block."""

    dtype: torch.dtype
    scale_key: str | None = None
    scale_dtype: torch.dtype = torch.float32


def _fp8_block(config: Mapping[str, Any], provenance: Mapping[str, Any]) -> tuple[tuple[int, int], bool]:
    quant = config.get("quantization_config") or {}
    block = provenance.get("fp8_block_size") or quant.get("weight_block_size") or [128, 128]
    # DeepSeek-V3.1 ships power-of-two (UE8M0) scales; requantised weights keep that property.
    return (int(block[0]), int(block[1])), quant.get("scale_fmt") == "ue8m0"


def requantize_fp8(
    weight: torch.Tensor, block: tuple[int, int], ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 weight -> (float8_e4m3fn weight, fp32 `_scale_inv`) per block, scale = amax / 448 (`quantize_fp8`);
    with `ue8m0` the scale is rounded up to a power of two (so no value clips) and the weight requantised with it."""
    q, scale = quantize_fp8(weight, block)
    if not ue8m0:
        return q, scale
    scale = torch.exp2(torch.ceil(torch.log2(scale)))
    m, n = weight.shape
    full = scale.repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :n]
    fmax = torch.finfo(torch.float8_e4m3fn).max
    return (weight.float() / full).clamp(-fmax, fmax).to(torch.float8_e4m3fn), scale


class _Writer:
    """Produces the stored form of each checkpoint tensor of the native layer: cast to the target's dtype, or FP8
    requantised (weight and `_scale_inv` come out of one quantisation, whichever is asked for first)."""

    def __init__(self, native: NativeLayer, stored: Mapping[str, _Stored], block: tuple[int, int], ue8m0: bool):
        self.native, self.stored, self.block, self.ue8m0 = native, stored, block, ue8m0
        self.scale_of = {s.scale_key: k for k, s in stored.items() if s.scale_key}
        self._pending: dict[str, torch.Tensor] = {}
        self.requantised: list[str] = []

    def names(self, key: str) -> list[str]:
        scale = self.stored[key].scale_key
        return [key, scale] if scale else [key]

    def spec(self, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) of a weight or scale key as it will be written."""
        if key in self.scale_of:
            weight = self.scale_of[key]
            m, n = self.native.shapes[weight]
            return self.stored[weight].scale_dtype, (math.ceil(m / self.block[0]), math.ceil(n / self.block[1]))
        return self.stored[key].dtype, self.native.shapes[key]

    def get(self, key: str) -> torch.Tensor:
        if key in self._pending:
            return self._pending.pop(key)
        weight = self.scale_of.get(key, key)
        stored = self.stored[weight]
        tensor = self.native.get(weight)
        if stored.scale_key is None:
            return tensor.to(stored.dtype) if tensor.is_floating_point() else tensor
        q, scale = requantize_fp8(tensor, self.block, self.ue8m0)
        self.requantised.append(weight)
        scale = scale.to(stored.scale_dtype)
        if key == weight:
            self._pending[stored.scale_key] = scale
            return q
        self._pending[weight] = q
        return scale


def _stored_from_target(ckpt: Checkpoint, keys: Iterable[str]) -> dict[str, _Stored]:
    out = {}
    for key in keys:
        dtype = ST_DTYPES[ckpt.info(key).dtype][0]
        scale = ckpt.scale_key(key)
        scale_dtype = ST_DTYPES[ckpt.info(scale).dtype][0] if scale else torch.float32
        out[key] = _Stored(dtype, scale, scale_dtype)
    return out


def _stored_from_provenance(
    native: NativeLayer, spec: Spec, target_config: Mapping[str, Any], provenance: Mapping[str, Any]
) -> dict[str, _Stored]:
    """Without the target: FP8 exactly where convert dequantised FP8 (provenance), module buffers (router bias)
    fp32, every other floating tensor in the target's torch_dtype (bf16 on every release we know)."""
    fp8 = set(provenance.get("dequantised_fp8") or [])
    with torch.device("meta"):
        module = NativeMtpDraft(spec, target_config, native.layer)
    buffers = {k for k, _ in module.named_buffers()}
    text = spec.text_config(target_config)
    default = DTYPES.get(str(text.get("torch_dtype") or target_config.get("torch_dtype") or "bfloat16"))
    out = {}
    for key in native.checkpoint_keys():
        if key in fp8:
            out[key] = _Stored(torch.float8_e4m3fn, key + SCALE_SUFFIX)
        else:
            out[key] = _Stored(torch.float32 if native.module_of[key] in buffers else default or torch.bfloat16)
    return out


def _export_nextn(
    src: Path,
    cfg: Mapping[str, Any],
    tmp: Path,
    provenance: Mapping[str, Any],
    record: dict[str, Any],
    target: str | None,
    revision: str | None,
    token: str | bool | None,
    progress: Progress,
) -> None:
    spec, target_config, layer = _native_input(src, cfg)
    if not spec.nextn.architecture:
        raise DraftError(
            f"spec {spec.name} has no [nextn] section: SGLang has no standalone NextN loader for this family "
            "(export --format stitched writes the layer back into the target instead)"
        )
    native = NativeLayer(src / WEIGHTS_FILE, spec, target_config, layer)
    if target:
        ckpt = _open_target(target, spec, target_config, revision, token)
        stored = _stored_from_target(ckpt, native.checkpoint_keys())
        block, ue8m0 = _fp8_block(ckpt.config, {"fp8_block_size": list(ckpt.fp8_block_size())})
        record.update(target=ckpt.source, target_commit=ckpt.commit)
    else:
        stored = _stored_from_provenance(native, spec, target_config, provenance)
        block, ue8m0 = _fp8_block(target_config, provenance)
    # Renumber: the same module tensors under a config with no trunk layers put layer 0 at `model.layers.0.`
    # (SGLang's NextN loader reads layer 0 when num_hidden_layers is 1).
    from .convert import native_to_checkpoint

    zero = _with_text_fields(spec, target_config, **{_num_layers_field(spec): 0})
    renamed: dict[str, str] = {}
    for module_key in dict.fromkeys(native.module_of.values()):
        shape = native._fh.get_slice(module_key).get_shape()
        meta = {module_key: torch.empty(shape, device="meta")}
        old = list(native_to_checkpoint(spec, target_config, layer, meta))
        new = list(native_to_checkpoint(spec, zero, 0, meta))
        renamed.update(zip(old, new, strict=True))
    writer = _Writer(native, stored, block, ue8m0)
    order = sorted(native.checkpoint_keys(), key=lambda k: _natural(renamed[k]))
    names = [
        (name, renamed[key] if name == key else renamed[key] + SCALE_SUFFIX)
        for key in order
        for name in writer.names(key)
    ]
    plan = [(new, *writer.spec(old)) for old, new in names]
    progress(f"writing the NextN layer ({len(plan)} tensors; MTP layer {layer} renumbered to layer 0)")
    with SafetensorsWriter(tmp / WEIGHTS_FILE, plan, {"format": "pt"}) as out:
        for old, new in names:
            out.write(new, writer.get(old))
    nextn_cfg = _with_text_fields(spec, target_config, **{_num_layers_field(spec): 1, spec.config.mtp_count: 1})
    nextn_cfg["architectures"] = [spec.nextn.architecture]
    if not writer.requantised:  # an FP8 quantization_config over bf16 weights would make SGLang expect scales
        nextn_cfg.pop("quantization_config", None)
    write_json(tmp / CONFIG_FILE, nextn_cfg)
    record.update(
        mtp_layer=layer,
        spec=spec.name,
        hidden_handover=cfg.get("hidden_handover", "post_norm"),  # which hidden the draft was trained to feed back
        requantised_fp8=sorted(renamed[k] for k in writer.requantised),
    )


def _target_index(ckpt: Checkpoint) -> dict[str, Any]:
    """The target's model.safetensors.index.json as stored (metadata included), or one built from its weight map."""
    raw = None
    try:
        if ckpt.is_local:
            raw = _read_json(Path(ckpt.source) / INDEX_FILE)
        elif ckpt.files.exists(INDEX_FILE):
            from huggingface_hub import hf_hub_download

            local = hf_hub_download(
                ckpt.source, INDEX_FILE, revision=ckpt.commit, token=getattr(ckpt.files, "token", None)
            )
            raw = _read_json(Path(local))
    except (OSError, DraftError):
        raw = None
    if not raw or not isinstance(raw.get("weight_map"), dict):
        raw = {"metadata": {"total_size": ckpt.total_bytes()}, "weight_map": dict(ckpt.weight_map)}
    return raw


def _export_stitched(
    src: Path,
    cfg: Mapping[str, Any],
    tmp: Path,
    provenance: Mapping[str, Any],
    record: dict[str, Any],
    target: str,
    revision: str | None,
    token: str | bool | None,
    progress: Progress,
) -> None:
    from .convert import plan_mtp_layer

    spec, target_config, layer = _native_input(src, cfg)
    ckpt = _open_target(target, spec, target_config, revision, token)
    native = NativeLayer(src / WEIGHTS_FILE, spec, ckpt.config, layer)
    foreign = [k for k in native.checkpoint_keys() if not ckpt.has(k)]
    if foreign:
        raise DraftError(f"the draft's {foreign[0]} has no counterpart in --target {target} (+{len(foreign) - 1})")
    plan = plan_mtp_layer(ckpt, spec, layer)
    uncovered = sorted(set(plan.checkpoint_keys) - set(native.checkpoint_keys()))
    if uncovered:
        raise DraftError(f"the draft lacks {uncovered[0]} of the target's MTP layer {layer} (+{len(uncovered) - 1})")
    # A tensor the layer shares with the trunk (ERNIE's final norm is `model.norm`) is the target's, not the
    # layer's: it is never rewritten, and a draft that changed it cannot be stitched without changing the target.
    shared = _trunk_keys(spec, ckpt.config, layer) & set(native.checkpoint_keys())
    for key in sorted(shared):
        stored_tensor = ckpt.read_raw([key])[key]
        if not torch.equal(native.get(key).to(stored_tensor.dtype), stored_tensor):
            raise DraftError(
                f"the draft changed {key}, which the MTP layer shares with the trunk: writing it back would change "
                "the target (keep it frozen when fine-tuning)"
            )
    keys = [k for k in native.checkpoint_keys() if k not in shared]
    stored = _stored_from_target(ckpt, keys)
    writer = _Writer(native, stored, ckpt.fp8_block_size(), _fp8_block(ckpt.config, {})[1])
    replaced = {name: key for key in keys for name in writer.names(key)}
    shards = sorted({ckpt.weight_map[name] for name in replaced}, key=_natural)
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
            for run in _runs(infos, COPY_RUN_BYTES):
                kept = ckpt.read_raw([i.name for i in run if i.name not in replaced])
                for info in run:
                    out.write(info.name, writer.get(info.name) if info.name in replaced else kept[info.name])
    write_json(tmp / INDEX_FILE, _target_index(ckpt))
    write_json(tmp / CONFIG_FILE, ckpt.config)
    (tmp / README_FILE).write_text(_stitched_readme(ckpt, spec, layer, shards, writer.requantised))
    if cfg.get("hidden_handover", "post_norm") == "post_norm":
        # vLLM's `method: "mtp"` chains the layer's pre-norm output: a draft trained for the post-norm hand-over
        # (SGLang's NextN, the default) keeps its step-1 quality there but loses some beyond it.
        progress(
            "note: this draft was trained to hand the post-norm hidden to the next step (SGLang); vLLM's MTP hands "
            "on the pre-norm one: for vLLM, distill with --hidden-handover pre_norm"
        )
    record.update(
        target=ckpt.source,
        target_commit=ckpt.commit,
        mtp_layer=layer,
        spec=spec.name,
        hidden_handover=cfg.get("hidden_handover", "post_norm"),
        overlay_files=[*shards, INDEX_FILE],
        requantised_fp8=sorted(writer.requantised),
    )


def _trunk_keys(spec: Spec, config: Mapping[str, Any], layer: int) -> set[str]:
    """Checkpoint keys of the trunk's embedding, head and final norm (shared, never the MTP layer's own)."""
    return {spec.key(t, config, layer) for t in (spec.keys.target_norm, spec.keys.target_embed, spec.keys.target_head)}


def _runs(infos: list, limit: int) -> Iterable[list]:
    run: list = []
    size = 0
    for info in infos:
        if run and size + info.nbytes > limit:
            yield run
            run, size = [], 0
        run.append(info)
        size += info.nbytes
    if run:
        yield run


def _stitched_readme(ckpt: Checkpoint, spec: Spec, layer: int, shards: list[str], requantised: list[str]) -> str:
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
    return f"""# Stitched MTP layer ({spec.name})

The fine-tuned MTP layer {layer} of `{where}`, written back under the checkpoint's own key names, dtypes and
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


def _natural(key: str) -> list[Any]:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- validation -------------------------------------------------------------------------------------------------
def detect_format(config: Mapping[str, Any]) -> str:
    """Which format a config.json describes (a target config with MTP layers reads as a stitched overlay)."""
    architectures = list(config.get("architectures") or [])
    if config.get("speculators_model_type") or SPECULATORS_ARCHITECTURE in architectures:
        return "speculators"
    if EAGLE3_ARCHITECTURE in architectures:
        return "sglang"
    if config.get("draft_kind") == "mtp":
        return "mtp"
    nextn = {s.nextn.architecture for s in _registry().values() if s.nextn.architecture}
    if any(a in nextn or a.endswith("NextN") for a in architectures):
        return "nextn"
    try:
        find_spec(config)
    except Exception as exc:
        raise DraftError(
            f"cannot tell the format from config.json (architectures {architectures}); pass --format"
        ) from exc
    return "stitched"


def _registry() -> dict[str, Spec]:
    from .spec import registry

    return registry()


def validate(path: str | Path, format: str | None = None) -> list[str]:
    """Every way directory `path` violates its format's contract (empty: the engines will load it as intended).

    format: one of `VALIDATE_FORMATS`, or None to detect it from config.json. Raises DraftError only when the
    directory or its config.json is unreadable or the format cannot be told."""
    path = Path(path)
    if not path.is_dir():
        raise DraftError(f"{path} is not a directory")
    cfg = _read_json(path / CONFIG_FILE)
    if cfg is None:
        raise DraftError(f"{path} has no {CONFIG_FILE}")
    fmt = format or detect_format(cfg)
    if fmt not in VALIDATE_FORMATS:
        raise DraftError(f"--format must be one of {', '.join(VALIDATE_FORMATS)}, got {fmt!r}")
    return _VALIDATORS[fmt](path, cfg)


def _load_weights(path: Path, problems: list[str]) -> dict[str, torch.Tensor] | None:
    from safetensors.torch import load_file

    file = path / WEIGHTS_FILE
    if not file.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
        return None
    try:
        return load_file(str(file))
    except Exception as exc:  # a corrupt file is a violation to report, not a crash
        problems.append(f"{WEIGHTS_FILE} cannot be read: {exc}")
        return None


def _nonfinite(name: str, tensor: torch.Tensor) -> str | None:
    if not (tensor.is_floating_point() and tensor.numel()):
        return None
    t = tensor.float()
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    if nan or inf:
        what = " and ".join(x for x, n in (("NaN", nan), ("Inf", inf)) if n)
        return f"{name} holds {what} ({nan} NaN, {inf} Inf of {t.numel()} values)"
    return None


def _validate_sglang(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    if cfg.get("architectures") != [EAGLE3_ARCHITECTURE]:
        problems.append(f"architectures is {cfg.get('architectures')}, SGLang needs [{EAGLE3_ARCHITECTURE!r}]")
    if cfg.get("model_type") != "llama":
        problems.append(f"model_type is {cfg.get('model_type')!r}, expected 'llama'")
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
    elif not _ids_ok(inner, 0):
        problems.append(f"eagle_config.eagle_aux_hidden_state_layer_ids {inner} must be three distinct ids >= 0")
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state is false: the engines would skip fc")
    if not top:
        problems.append(
            "top-level eagle_aux_hidden_state_layer_ids is missing: vLLM would capture its default layers "
            "(or read eagle_config's 'output of layer' ids as 'input of layer' ids, one layer early)"
        )
    elif inner and _ids_ok(inner, 0) and [_int(i) for i in top] != [int(i) + 1 for i in inner]:
        problems.append(
            f"aux ids disagree: eagle_config {list(inner)} (SGLang, 'output of layer i') needs top-level "
            f"{[int(i) + 1 for i in inner]} (vLLM, 'input of layer i' = id + 1), found {list(top)}"
        )
    weights = _load_weights(path, problems)
    if weights is not None:
        problems += _eagle3_weight_problems(cfg, weights, SGLANG_PREFIX, int(cfg.get("vocab_size") or 0))
    return problems


def _int(value: Any) -> Any:
    return int(value) if isinstance(value, int | float) else value


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
    if cfg.get("hidden_act", "silu") != "silu":
        problems.append(f"{where}hidden_act is {cfg.get('hidden_act')!r}: the EAGLE-3 layer's MLP is SwiGLU (silu)")
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
        # the vocabulary maps exist only for a reduced draft vocabulary (see `without_identity_maps`)
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
    want_dtype = DTYPES.get(str(cfg.get("torch_dtype")))
    floats = {n: t.dtype for n, t in weights.items() if n not in ("d2t", "t2d") and t.is_floating_point()}
    for name, t in weights.items():
        if name in ("d2t", "t2d"):
            continue
        if not t.is_floating_point():
            problems.append(f"{name} is {_dtype_name(t.dtype)}, expected a floating dtype")
        elif want_dtype is not None and t.dtype != want_dtype:
            problems.append(
                f"{name} is {_dtype_name(t.dtype)} but config.json says torch_dtype {cfg.get('torch_dtype')}"
            )
    if want_dtype is None and len(set(floats.values())) > 1:
        problems.append(f"weights mix dtypes {sorted({_dtype_name(d) for d in floats.values()})}")
    for name, t in weights.items():
        if (msg := _nonfinite(name, t)) is not None:
            problems.append(msg)
    problems += _vocab_problems(weights, vocab, int(cfg.get("draft_vocab_size") or 0))
    return problems


def _vocab_problems(weights: Mapping[str, torch.Tensor], vocab: int, draft_vocab: int) -> list[str]:
    """d2t int64 [Vd] (target = draft id + d2t[draft id], inside [0, V), strictly increasing) and t2d bool [V]
    marking exactly those targets."""
    problems: list[str] = []
    d2t, t2d = weights.get("d2t"), weights.get("t2d")
    if d2t is not None and d2t.dtype != torch.int64:
        problems.append(f"d2t is {_dtype_name(d2t.dtype)}, engines expect int64")
    if t2d is not None and t2d.dtype != torch.bool:
        problems.append(f"t2d is {_dtype_name(t2d.dtype)}, expected bool")
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
    if cfg.get("architectures") != [SPECULATORS_ARCHITECTURE]:
        problems.append(f"architectures is {cfg.get('architectures')}, expected [{SPECULATORS_ARCHITECTURE!r}]")
    if cfg.get("speculators_model_type") != "eagle3":
        problems.append(f"speculators_model_type is {cfg.get('speculators_model_type')!r}, expected 'eagle3'")
    if not cfg.get("speculators_version"):
        problems.append("speculators_version is missing")
    sc = cfg.get("speculators_config")
    if not isinstance(sc, dict):
        problems.append("speculators_config is missing")
        sc = {}
    else:
        if sc.get("algorithm") != "eagle3":
            problems.append(f"speculators_config.algorithm is {sc.get('algorithm')!r}, expected 'eagle3'")
        methods = sc.get("proposal_methods")
        if not isinstance(methods, list) or not methods:
            problems.append("speculators_config.proposal_methods is missing or empty (vLLM reads k from the first)")
        else:
            for i, m in enumerate(methods):
                k = m.get("speculative_tokens") if isinstance(m, dict) else None
                if not isinstance(m, dict) or not m.get("proposal_type"):
                    problems.append(f"speculators_config.proposal_methods[{i}] has no proposal_type")
                if not isinstance(k, int) or k < 1:
                    problems.append(f"speculators_config.proposal_methods[{i}].speculative_tokens must be >= 1")
            types = [m.get("proposal_type") for m in methods if isinstance(m, dict)]
            if sc.get("default_proposal_method") not in types:
                problems.append(
                    f"speculators_config.default_proposal_method {sc.get('default_proposal_method')!r} is not one of "
                    f"the proposal methods {types}"
                )
        verifier = sc.get("verifier")
        if not isinstance(verifier, dict) or "name_or_path" not in verifier or "architectures" not in verifier:
            problems.append("speculators_config.verifier needs name_or_path and architectures")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        problems.append("transformer_layer_config is missing (vLLM refuses the config)")
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
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        problems.append(
            "eagle_aux_hidden_state_layer_ids is missing: vLLM would capture its default layers, not the ones the "
            "draft was trained on"
        )
    elif not _ids_ok(ids, 1):
        problems.append(
            f"eagle_aux_hidden_state_layer_ids {ids} must be three distinct ids >= 1 ('input of layer i' terms)"
        )
    for key, want in NORM_SWITCHES.items():
        if key not in cfg:
            default = " (vLLM then assumes true)" if key == "norm_before_residual" else ""
            problems.append(f"{key} is not written explicitly{default}; mtp2draft's EAGLE-3 needs {key}={want}")
        elif cfg[key] is not want:
            problems.append(f"{key} is {cfg[key]!r}; mtp2draft's EAGLE-3 computation needs {want}")
    weights = _load_weights(path, problems)
    if weights is not None:
        vocab = int(layer.get("vocab_size") or 0)
        merged = {**layer, **{k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size") if k in cfg}}
        merged["torch_dtype"] = cfg.get("torch_dtype") or layer.get("torch_dtype")
        problems += _eagle3_weight_problems(merged, weights, SPECULATORS_PREFIX, vocab, layer)
    return problems


def _meta_checkpoint(spec: Spec, target_config: Mapping[str, Any], key_config: Mapping[str, Any], layer: int):
    """(checkpoint key -> shape, module-buffer checkpoint keys) of one MTP layer, from meta tensors."""
    from .convert import native_to_checkpoint

    with torch.device("meta"):
        module = NativeMtpDraft(spec, target_config, layer)
    state = module.state_dict()
    buffers = {k for k, _ in module.named_buffers()}
    shapes: dict[str, tuple[int, ...]] = {}
    buffer_keys: set[str] = set()
    for module_key, t in state.items():
        for key, out in native_to_checkpoint(spec, dict(key_config), layer, {module_key: t}).items():
            shapes[key] = tuple(out.shape)
            if module_key in buffers:
                buffer_keys.add(key)
    return shapes, buffer_keys


def _fp8_problems(name: str, tensor_dtype: str, shape, headers: Mapping[str, Any], block) -> list[str]:
    """An FP8 weight needs its `_scale_inv` sibling of shape [ceil(M/bm), ceil(N/bn)]."""
    if tensor_dtype not in ("F8_E4M3", "F8_E5M2"):
        return []
    scale = headers.get(name + SCALE_SUFFIX)
    if scale is None:
        return [f"{name} is FP8 but {name + SCALE_SUFFIX} is missing"]
    want = [math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])] if len(shape) == 2 else None
    if want is None or list(scale[1]) != want:
        return [f"{name + SCALE_SUFFIX} has shape {list(scale[1])}, expected {want} for a {list(shape)} weight"]
    return []


def _headers(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) from a file's header (no tensor bytes read)."""
    import struct

    with open(file, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _validate_nextn(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    try:
        spec = find_spec({"model_type": cfg.get("model_type")})
    except Exception:
        return [f"model_type {cfg.get('model_type')!r} matches no spec: cannot check the NextN layer's tensors"]
    text = spec.text_config(cfg)
    if text.get(_num_layers_field(spec)) != 1:
        problems.append(f"{_num_layers_field(spec)} is {text.get(_num_layers_field(spec))}, a NextN checkpoint has 1")
    if spec.config.mtp_count in text and text.get(spec.config.mtp_count) != 1:
        problems.append(f"{spec.config.mtp_count} is {text.get(spec.config.mtp_count)}; SGLang's NextN loader needs 1")
    if spec.nextn.architecture and cfg.get("architectures") != [spec.nextn.architecture]:
        problems.append(f"architectures is {cfg.get('architectures')}, SGLang needs [{spec.nextn.architecture!r}]")
    file = path / WEIGHTS_FILE
    if not file.is_file():
        return [*problems, f"{WEIGHTS_FILE} is missing"]
    try:
        headers = _headers(file)
    except Exception as exc:
        return [*problems, f"{WEIGHTS_FILE} cannot be read: {exc}"]
    zero = _with_text_fields(spec, cfg, **{_num_layers_field(spec): 0})
    try:
        expected, _ = _meta_checkpoint(spec, cfg, zero, 0)
    except Exception as exc:
        return [*problems, f"cannot build the {spec.name} MTP block from config.json: {exc}"]
    comp = spec.component_keys(zero, 0)
    banned = {comp.get("embed"): "embed_tokens", comp.get("head"): "shared_head.head / lm_head"}
    for name in headers:
        if name in banned or name.endswith(("embed_tokens.weight", "lm_head.weight")):
            problems.append(f"{name} is present: a NextN checkpoint shares the target's embedding and head")
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size") or [128, 128]
    for name, shape in expected.items():
        if name not in headers:
            problems.append(f"{name} is missing")
        elif list(headers[name][1]) != list(shape):
            problems.append(f"{name} has shape {headers[name][1]}, the config implies {list(shape)}")
        else:
            problems += _fp8_problems(name, headers[name][0], shape, headers, block)
    for name in headers:
        banned_name = name in banned or name.endswith(("embed_tokens.weight", "lm_head.weight"))
        if name not in expected and not name.endswith(SCALE_SUFFIX) and not banned_name:
            problems.append(f"{name} is not a tensor of the NextN layer (layer 0)")
    has_fp8 = any(headers[n][0] in ("F8_E4M3", "F8_E5M2") for n in headers)
    if has_fp8 and not quant:
        problems.append("FP8 tensors but config.json has no quantization_config")
    if quant.get("quant_method") == "fp8" and not has_fp8:
        problems.append("quantization_config says fp8 but no tensor is FP8: SGLang would look for scales")
    problems += _finite_file(file, [n for n in headers if n in expected or n.endswith(SCALE_SUFFIX)])
    return problems


def _finite_file(file: Path, names: list[str]) -> list[str]:
    from safetensors import safe_open

    problems = []
    with safe_open(str(file), framework="pt") as fh:
        for name in names:
            if (msg := _nonfinite(name, fh.get_tensor(name))) is not None:
                problems.append(msg)
    return problems


def _validate_stitched(path: Path, cfg: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    try:
        spec = find_spec(cfg)
    except Exception as exc:
        return [f"config.json matches no spec ({exc})"]
    count = spec.num_mtp_layers(cfg)
    if count <= 0:
        return [f"config.json declares no MTP layer ({spec.config.mtp_count})"]
    index = _read_json(path / INDEX_FILE)
    weight_map = index.get("weight_map") if index else None
    if not isinstance(weight_map, dict):
        return [f"{INDEX_FILE} is missing or has no weight_map"]
    present = {p.name for p in path.glob("*.safetensors")}
    for file in sorted(present - set(weight_map.values())):
        problems.append(f"{file} is in the overlay but the index maps no tensor to it")
    prefixes = [spec.key(spec.keys.block, cfg, i) for i in range(count)]
    trunk = {k for i in range(count) for k in _trunk_keys(spec, cfg, i)}
    named = {k for i in range(count) for k in spec.component_keys(cfg, i).values()} - trunk
    mtp_keys = [k for k in weight_map if k in named or k.startswith(tuple(prefixes))]
    if not mtp_keys:
        problems.append("the index maps no MTP tensor")
    for key in mtp_keys:
        if weight_map[key] not in present:
            problems.append(f"the index maps MTP tensor {key} to {weight_map[key]}, which is missing from the overlay")
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size") or [128, 128]
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(count):
        try:
            shapes, _ = _meta_checkpoint(spec, cfg, cfg, i)
        except Exception as exc:
            problems.append(f"cannot build the {spec.name} MTP block from config.json: {exc}")
            break
        expected.update(shapes)
    for key in sorted(set(expected) - set(weight_map), key=_natural):
        problems.append(f"the index lacks MTP tensor {key}")
    for file in sorted(present & set(weight_map.values())):
        try:
            headers = _headers(path / file)
        except Exception as exc:
            problems.append(f"{file} cannot be read: {exc}")
            continue
        mapped = {k for k, f in weight_map.items() if f == file}
        for key in sorted(mapped - set(headers), key=_natural):
            problems.append(f"the index maps {key} to {file}, which does not hold it")
        for key in sorted(set(headers) - mapped, key=_natural):
            problems.append(f"{file} holds {key}, which the index maps elsewhere")
        for key in sorted(set(headers) & set(expected), key=_natural):
            if list(headers[key][1]) != list(expected[key]):
                problems.append(f"{key} has shape {headers[key][1]}, the config implies {list(expected[key])}")
            else:
                problems += _fp8_problems(key, headers[key][0], expected[key], headers, block)
        mtp_here = [
            k for k in headers if k in expected or (k.endswith(SCALE_SUFFIX) and k[: -len(SCALE_SUFFIX)] in expected)
        ]
        problems += _finite_file(path / file, mtp_here)
    return problems


def _validate_native(path: Path, cfg: dict[str, Any]) -> list[str]:
    """mtp2draft's own native draft directory: the module's tensors under module names, shapes from the config."""
    problems: list[str] = []
    try:
        spec, target_config, layer = get_spec(cfg["spec"]), cfg["target_config"], int(cfg.get("mtp_layer", 0))
        with torch.device("meta"):
            module = NativeMtpDraft(spec, target_config, layer)
    except Exception as exc:
        return [f"cannot build the native module from config.json: {exc}"]
    weights = _load_weights(path, problems)
    if weights is None:
        return problems
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    for key in sorted(set(expected) - set(weights)):
        problems.append(f"{key} is missing")
    for key in sorted(set(weights) - set(expected)):
        problems.append(f"{key} is not a tensor of the {spec.name} MTP module")
    for key in sorted(set(weights) & set(expected)):
        if tuple(weights[key].shape) != expected[key]:
            problems.append(f"{key} has shape {list(weights[key].shape)}, the config implies {list(expected[key])}")
        if (msg := _nonfinite(key, weights[key])) is not None:
            problems.append(msg)
    return problems


_VALIDATORS: dict[str, Callable[[Path, dict[str, Any]], list[str]]] = {
    "sglang": _validate_sglang,
    "speculators": _validate_speculators,
    "nextn": _validate_nextn,
    "stitched": _validate_stitched,
    "mtp": _validate_native,
}

__all__ = [
    "FORMATS",
    "NORM_SWITCHES",
    "ExportResult",
    "detect_format",
    "export",
    "requantize_fp8",
    "speculators_to_eagle3_config",
    "speculators_weight_name",
    "validate",
]
