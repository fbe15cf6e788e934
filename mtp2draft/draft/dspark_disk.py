"""A Qwen3-style DSpark drafter on disk: the directory vLLM reads as a speculators `dspark` speculator.

One layout serves mtp2draft's own stages and the engine, so a drafter `distill` writes is the one `evaluate` reads
and vLLM serves. Facts from vLLM 0.32 (CPU build), `transformers_utils/configs/speculators/algos.py`
(`update_dspark`) and `model_executor/models/qwen3_dspark.py` (`Qwen3DSparkForCausalLM.load_weights`):
- config.json: `speculators_model_type: "dspark"`, the layers' Qwen3 config as `transformer_layer_config`,
  `aux_hidden_state_layer_ids` (target layer id + 1: vLLM maps them back with `i - 1`), `mask_token_id`,
  `markov_rank`, `block_size`, `enable_confidence_head`, `confidence_head_with_markov`, and `sample_from_anchor`
  (true here: slot 0 holds the last verified token and predicts the next one, as `draft.dspark` drafts; vLLM's
  default for a speculators checkpoint is the fill-in layout, false), plus the `speculators_config` every
  speculators checkpoint carries (greedy proposal of `block_size` tokens, the verifier);
- model.safetensors: `fc`, `hidden_norm`, `layers.{i}.*` (Qwen3 names), `norm`, `markov_head.markov_w{1,2}`,
  `confidence_head.proj.{weight,bias}`; no `embed_tokens` or `lm_head`: vLLM shares the target's when they are
  absent, and so does `load_dspark`.

What this module does not do: read a release's DSpark stages (`conversion.dspark` keeps their own names; DeepSeek-V4's
stage is another module), run the target, or train.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config

from mtp2draft.draft.dspark import DSparkDraft
from mtp2draft.draft.dspark_v4 import DSparkV4Draft
from mtp2draft.draft.dspark_v4_io import load_dspark_v4, write_dspark_v4
from mtp2draft.errors import DraftError, read_json_file
from mtp2draft.family.dspark import DSparkFields, layouts
from mtp2draft.kinds import CONFIG_FILE, DSPARK_KIND, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.writer import save_tensors

MODEL_TYPE = "dspark"  # speculators_model_type and speculators_config.algorithm
ARCHITECTURE = "Qwen3DSparkModel"  # what vLLM 0.32's update_dspark selects
SHARED = ("embed_tokens.", "lm_head.")  # the target's, never stored
# mtp2draft's module names -> the stored names vLLM loads (everything else keeps its name)
STORED_NAMES = {
    "confidence_head.weight": "confidence_head.proj.weight",
    "confidence_head.bias": "confidence_head.proj.bias",
}
# the Qwen3Config fields a DSpark layer stack takes from its target's config
LAYER_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "max_position_embeddings", "vocab_size", "hidden_act",
)  # fmt: skip


def is_speculators_dspark(cfg: Mapping[str, Any]) -> bool:
    """True for a config.json this module writes."""
    return cfg.get("speculators_model_type") == MODEL_TYPE


def layers_config(target_config: Mapping[str, Any], num_layers: int) -> Qwen3Config:
    """The Qwen3 config of a `num_layers`-layer drafter for a target: its width, heads, MLP and rope. A target with
    latent attention (no `head_dim` / `num_key_value_heads`) gets `hidden / heads` and full multi-head attention."""
    text = target_config.get("text_config") or target_config
    fields = {k: text[k] for k in LAYER_FIELDS if text.get(k) is not None}
    heads = fields["num_attention_heads"]
    fields.setdefault("head_dim", fields["hidden_size"] // heads)
    fields.setdefault("num_key_value_heads", heads)
    fields.setdefault("intermediate_size", text.get("moe_intermediate_size") or 4 * fields["hidden_size"])
    return Qwen3Config(**fields, num_hidden_layers=num_layers, attention_bias=False, tie_word_embeddings=False)


def new_dspark_draft(
    target_config: Mapping[str, Any],
    fields: DSparkFields,
    num_layers: int,
    embedding: torch.Tensor,
    head: torch.Tensor,
    seed: int = 0,
) -> DSparkDraft:
    """A randomly initialised drafter for a target, sharing (and freezing) its embedding [V, H] and head [V, H].
    The Markov head's w2 and the confidence head start at zero, so the first bias is none and the first
    confidence 0.5."""
    torch.manual_seed(seed)
    draft = DSparkDraft(layers_config(target_config, num_layers), fields, confidence_bias=True)
    with torch.no_grad():
        draft.markov_head.markov_w2.weight.zero_()
        draft.confidence_head.weight.zero_()
        draft.confidence_head.bias.zero_()
    share_target(draft, embedding, head)
    return draft


def share_target(draft: DSparkDraft, embedding: torch.Tensor, head: torch.Tensor) -> None:
    """Point the drafter's embedding and head at the target's tensors, frozen (the target is never written)."""
    for module, weight in ((draft.embed_tokens, embedding), (draft.lm_head, head)):
        if tuple(module.weight.shape) != tuple(weight.shape):
            raise DraftError(f"the target's {tuple(weight.shape)} embedding / head does not fit this drafter")
        module.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)


def own_tensors(draft: DSparkDraft) -> dict[str, torch.Tensor]:
    """The drafter's own weights under their stored names (no embedding, no head)."""
    return {
        STORED_NAMES.get(k, k): v.detach().contiguous()
        for k, v in draft.state_dict().items()
        if not k.startswith(SHARED)
    }


def dspark_config(draft: DSparkDraft, verifier: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """config.json for `draft`; `verifier`: the target's `name_or_path` and `architectures`."""
    f = draft.fields
    layers = draft.layers_config.to_dict()
    layers.pop("transformers_version", None)
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "transformer_layer_config": {**layers, "torch_dtype": dtype},
        "aux_hidden_state_layer_ids": [i + 1 for i in f.target_layer_ids],
        "mask_token_id": f.noise_token_id,
        "markov_rank": f.markov_rank,
        "block_size": f.block_size,
        "sample_from_anchor": True,
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": f.block_size}],
            "default_proposal_method": "greedy",
            "verifier": dict(verifier),
        },
    }


def save_dspark(draft: DSparkDraft, out: Path, verifier: Mapping[str, Any], dtype: str = "float32") -> None:
    """Write config.json and model.safetensors of `draft` into the existing directory `out`."""
    torch_dtype = getattr(torch, dtype)
    # the confidence head is fp32 in vLLM (DSparkConfidenceHead params_dtype); everything else in `dtype`
    tensors = {
        k: v.float() if k.startswith("confidence_head.") else v.to(torch_dtype) for k, v in own_tensors(draft).items()
    }
    save_tensors(out / WEIGHTS_FILE, tensors, {"format": "pt"})
    write_json(out / CONFIG_FILE, dspark_config(draft, verifier, dtype))


def fields_of(cfg: Mapping[str, Any]) -> DSparkFields:
    """The DSpark settings a speculators dspark config.json holds."""
    try:
        return DSparkFields(
            block_size=int(cfg["block_size"]),
            target_layer_ids=tuple(int(i) - 1 for i in cfg["aux_hidden_state_layer_ids"]),
            noise_token_id=int(cfg["mask_token_id"]),
            markov_rank=int(cfg["markov_rank"]),
            n_routed_experts=None,
            num_experts_per_tok=None,
            section="config.json",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise DraftError(f"config.json is not a complete speculators dspark config: {type(e).__name__} {e}") from None


def load_dspark(path: str | Path, embedding: torch.Tensor, head: torch.Tensor) -> DSparkDraft:
    """Read a drafter this module wrote (or any speculators dspark directory with the target's vocabulary),
    sharing the target's embedding [V, H] and head [V, H]. Every stored tensor must be used and every own
    parameter found: a mismatch is refused in one line."""
    path = Path(path)
    cfg = read_json_file(path / CONFIG_FILE, DraftError)
    if not is_speculators_dspark(cfg):
        raise DraftError(f"{path}: config.json is not a speculators dspark drafter")
    if not cfg.get("sample_from_anchor", False):
        raise DraftError(
            f"{path}: sample_from_anchor is false (the fill-in layout: the block's first slot is a bonus token that "
            "predicts nothing); mtp2draft drafts anchor-first, as the DSpark releases do"
        )
    layers = Qwen3Config(**cfg["transformer_layer_config"])
    draft = DSparkDraft(layers, fields_of(cfg), confidence_bias=True)
    share_target(draft, embedding, head)
    stored = load_file(str(path / WEIGHTS_FILE))
    back = {v: k for k, v in STORED_NAMES.items()}
    state = {back.get(k, k): v for k, v in stored.items()}
    want = {k for k in draft.state_dict() if not k.startswith(SHARED)}
    missing, unknown = sorted(want - set(state)), sorted(set(state) - want)
    if missing or unknown:
        raise DraftError(
            f"{path}: model.safetensors does not match its config: missing {missing[:3]}, unknown {unknown[:3]}"
        )
    own = draft.state_dict()
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise DraftError(f"{path}: {k} is {tuple(v.shape)}, its config says {tuple(own[k].shape)}")
    draft.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in state.items()}})
    return draft


# a layout's `stage` (model_specs/dspark/*.toml) -> what loads a directory of its stages
STAGES = {"hyper_stages": load_dspark_v4, "qwen3_layers": load_dspark}  # DeepSeek-V4's streams + MoE; Qwen3 layers


def open_dspark(path: str | Path, embedding: torch.Tensor, head: torch.Tensor) -> torch.nn.Module:
    """Any dspark draft directory as a runnable drafter (`forward`, `draft_block`, `fields`): a speculators dspark
    directory (`load_dspark`), or a release's stages as `convert` writes them (config.json `draft_kind: dspark`)."""
    path = Path(path)
    cfg = read_json_file(path / CONFIG_FILE, DraftError)
    if is_speculators_dspark(cfg):
        return load_dspark(path, embedding, head)
    if cfg.get("draft_kind") == DSPARK_KIND:  # a release's stages under their own names
        name = cfg.get("layout", "deepseek_v4_0731")  # directories converted before layouts were recorded: V4-0731's
        layout = layouts().get(name)
        if layout is None or not layout.stage:
            raise DraftError(
                f"{path}: {name} DSpark stages are read exactly by inspect and convert, but mtp2draft does not build "
                "their stage yet, so they cannot be run"
            )
        return STAGES[layout.stage](path, embedding, head)
    raise DraftError(f"{path}: config.json describes no DSpark drafter")


def write_drafter(draft: torch.nn.Module, out: Path, verifier: Mapping[str, Any], dtype: str) -> None:
    """Write any drafter `open_dspark` returns into the existing directory `out`, in the layout it came in: a
    release's DeepSeek-V4 stages under the release's names (their stored dtypes kept), a Qwen3-style drafter in
    speculators' layout for `verifier` in `dtype`."""
    if isinstance(draft, DSparkV4Draft):
        write_dspark_v4(draft, out)
    else:
        save_dspark(draft, out, verifier, dtype)


def check_fits(draft: torch.nn.Module, target: Any, where: str) -> None:
    """Refuse a drafter made for another target's width, vocabulary or depth (`target`: a `TargetModel`), or one
    reading the embedding output (-1), which `TargetModel.run` does not capture; `evaluate` and `distill` ask."""
    layers, ids = draft.layers_config, draft.fields.target_layer_ids
    for what, mine, theirs in (
        ("hidden size", layers.hidden_size, target.hidden_size),
        ("vocabulary", layers.vocab_size, target.vocab_size),
    ):
        if mine != theirs:
            raise DraftError(f"{where} has {what} {mine}, the target {target.source} has {theirs}: not its drafter")
    if min(ids) < 0 or max(ids) >= target.num_layers:
        raise DraftError(
            f"{where} reads target layers {list(ids)}; {target.source} gives layers 0..{target.num_layers - 1}"
            + (" (-1, the embedding output, is not read yet)" if min(ids) < 0 else "")
        )
