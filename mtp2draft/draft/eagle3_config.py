"""EAGLE-3 config codecs: mtp2draft's EAGLE-3 draft config <-> SGLang's `LlamaForCausalLMEagle3` config.json and
vLLM's speculators `Eagle3Speculator` config.json, the weight-name mapping between the two layouts, and how each
engine reads the aux layer ids (the engines' readers are the contract: SGLang 0.5.23
`python/sglang/srt/models/llama_eagle3.py`, vLLM 0.33 `vllm/model_executor/models/llama_eagle3.py` and
`vllm/transformers_utils/configs/speculators/`; docs/formats.md).

Torch-free (a dtype is only named). `draft/modules.py` loads either layout through these; `conversion.py` writes the aux ids
with them; the `sglang` / `speculators` formats (`eagle3.py`) write and check the files.

What this module does not do: read or write weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mtp2draft.errors import DraftError
from mtp2draft.family.spec import get_spec
from mtp2draft.kinds import EAGLE3_ARCHITECTURE, DraftKind

if TYPE_CHECKING:
    import torch

SPECULATORS_ARCHITECTURE = "Eagle3Speculator"

# The speculators release whose `Eagle3SpeculatorConfig` schema (norm_before_fc, fc_norm, norm_output) we checked.
# Informational: neither vLLM nor speculators compares it with anything.
SPECULATORS_VERSION = "0.7.0.1"

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
    trained = [int(i) - 1 for i in ids]
    spec_name = (cfg.get("mtp2draft") or {}).get("spec")
    out["eagle_config"] = {
        "eagle_aux_hidden_state_layer_ids": eagle_config_ids(trained, spec_name),
        "use_aux_hidden_state": True,
    }
    out["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in ids]
    for key in ("mtp2draft", "mtp2draft_init"):
        if key in cfg:
            out[key] = cfg[key]
    return out


def speculators_weight_name(name: str) -> str:
    """speculators weight name -> SGLang-layout name (`layers.0.` -> `midlayer.`)."""
    return SGLANG_PREFIX + name[len(SPECULATORS_PREFIX) :] if name.startswith(SPECULATORS_PREFIX) else name


def sglang_aux_rule(spec_name: str | None) -> str:
    """How SGLang reads `eagle_config` aux ids for the draft's target family (`[engines.sglang] aux_ids`); the
    Llama rule (`plus_one`) when the family is unknown or its spec lists no SGLang facts."""
    if not spec_name:
        return "plus_one"
    facts = get_spec(spec_name).engine("sglang")
    return facts.aux_ids if facts is not None else "plus_one"


def sglang_aux_ids(trained: list[int], rule: str) -> list[int] | None:
    """`eagle_config` ids that make SGLang capture the outputs of layers `trained` under `rule`; None when no ids can.

    `plus_one` (Llama, Qwen2, GLM, Qwen3-Next/3.5, LongCat): SGLang captures the input of layer id + 1, so the ids
    are written as they are. `plus_one_if_first_is_one` (DeepSeek V2/V3/V3.2): + 1 only when the first id is 1,
    else the ids are captured layer inputs as they stand; ids starting at 1 are written as they are, ids starting at
    2 or more + 1 each (their first is then >= 3), and ids starting at 0 (the output of layer 0 would need a first id
    of 1, which SGLang shifts) cannot be expressed."""
    if rule == "plus_one" or trained[0] == 1:
        return list(trained)
    if trained[0] >= 2:
        return [i + 1 for i in trained]
    return None


def sglang_captured_outputs(eagle_ids: list[int], rule: str) -> list[int]:
    """The layers whose outputs SGLang feeds the draft for `eagle_config` ids under `rule` (the inverse)."""
    if rule == "plus_one" or eagle_ids[0] == 1:
        return list(eagle_ids)
    return [i - 1 for i in eagle_ids]


def aux_ids(cfg: Mapping[str, Any]) -> list[int]:
    """The aux layer ids a draft was trained on ('output of layer i'): the top-level vLLM ids ('input of layer i')
    - 1, which every engine reads alike; without them, `eagle_config`'s ids as SGLang reads them for the family."""
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if top is not None:
        if len(top) != 3:
            raise DraftError(f"the draft's eagle_aux_hidden_state_layer_ids {list(top)} are not three ids")
        return [int(i) - 1 for i in top]
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids or len(ids) != 3:
        raise DraftError("the draft's config.json has no eagle_config.eagle_aux_hidden_state_layer_ids (three ids)")
    return sglang_captured_outputs([int(i) for i in ids], sglang_aux_rule(draft_spec_name(cfg)))


def draft_spec_name(cfg: Mapping[str, Any]) -> str | None:
    return (cfg.get("mtp2draft") or {}).get("spec")


def eagle_config_ids(trained: list[int], spec_name: str | None) -> list[int]:
    """`eagle_config` ids to write for `trained` aux layers: SGLang's reading for the family when it can express
    them, else the plain ids (the `sglang` validator then says SGLang would misread them)."""
    ids = sglang_aux_ids(trained, sglang_aux_rule(spec_name))
    return ids if ids is not None else list(trained)


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
    ids = aux_ids(cfg)
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
        "torch_dtype": dtype_name(dtype),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": eagle_config_ids(ids, draft_spec_name(cfg)),
            "use_aux_hidden_state": True,
        },
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids],
    }
    out.update({k: cfg[k] for k in TOKEN_FIELDS if k in cfg})
    out.update({k: cfg[k] for k in ("mtp2draft", "mtp2draft_init") if k in cfg})
    return out


def speculators_config(
    cfg: Mapping[str, Any], dtype: torch.dtype, speculative_tokens: int, verifier: Mapping[str, Any]
) -> dict[str, Any]:
    """config.json of vLLM's speculators `Eagle3Speculator` format from an EAGLE-3 draft config."""
    ids = aux_ids(cfg)
    layer = {
        "model_type": "llama",  # vLLM's update_eagle3 picks Eagle3LlamaForCausalLM from this
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        **_llama_fields(cfg),
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": int(cfg["vocab_size"]),  # the TARGET's vocabulary (t2d's length)
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name(dtype),
    }
    layer.update({k: cfg[k] for k in TOKEN_FIELDS if k in cfg})
    out: dict[str, Any] = {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": DraftKind.EAGLE3,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": DraftKind.EAGLE3,
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
        "torch_dtype": dtype_name(dtype),
    }
    out.update({k: cfg[k] for k in ("mtp2draft", "mtp2draft_init") if k in cfg})
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
