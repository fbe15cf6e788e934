"""Hidden-state sources: what the draft reads from the frozen target.

A draft needs, per position p of a sequence:
- its step-0 input: the target's final hidden state (native MTP; before or after the final norm, as the family's
  spec says) or the outputs of three target layers concatenated (EAGLE-3 `fc` input);
- the target's next-token distribution at p (the teacher for the token the draft predicts).

Two sources give the same `Features`:
- `TargetModel`: a transformers model loaded from a SOURCE (local directory or hub repo, as `convert` resolves it),
  in eval mode with every parameter frozen (`requires_grad=False`); no optimizer ever sees it and nothing writes
  to it. `device_map` spreads a large target across local GPUs.
- `dumps.OfflineHiddenStates`: files written earlier by `dump-hidden` (or converted from an inference engine's
  dump), so targets too large for one machine can be served by vLLM/SGLang and the draft trained from files
  (`dumps.py` writes and reads them).

What this module does not do: train or evaluate (`train/recipe.py`, `evaluation/decode.py`), or tokenise data (`data.py`).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mtp2draft.checkpoint import network
from mtp2draft.checkpoint.reader import INDEX_FILE, SINGLE_FILE, open_checkpoint, parse_index, read_config
from mtp2draft.dtypes import TORCH_DTYPES
from mtp2draft.errors import CheckpointError, DataError, DraftError, OptionError, SourceError, read_json_file
from mtp2draft.family.schema import Spec
from mtp2draft.family.spec import find_spec
from mtp2draft.kinds import DraftKind, Hidden
from mtp2draft.progress import quiet_transformers
from mtp2draft.target import dump_checks
from mtp2draft.target.dequantised import dequantised_view, needs_dequantised_view
from mtp2draft.target.trunk_names import trunk_key_mapping

HIDDEN_SCHEMA_VERSION = 1
MANIFEST, SHARED_FILE = dump_checks.MANIFEST, dump_checks.SHARED_FILE  # the names dump_checks checks


@dataclass
class Features:
    """Per-position target outputs for a batch [B, T].

    final: [B, T, H] the final hidden state the native MTP layer reads (None when not requested);
    aux: [B, T, 3 * H] the concatenated outputs of the EAGLE-3 aux layers, low to high (None when not requested);
    logits: [B, T, V] target next-token logits (online), or None when only top-k log-probs are known;
    topk_logprobs / topk_ids: [B, T, k] the target's top-k log-probs (offline), else None.
    """

    final: torch.Tensor | None
    aux: torch.Tensor | None
    logits: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None

    def step0_input(self, kind: str) -> torch.Tensor:
        features = self.aux if kind == DraftKind.EAGLE3 else self.final
        if features is None:
            raise DataError(f"these hidden states do not hold what a {kind} draft reads")
        return features


# Weight files that are pickles: never loaded (loading one runs whatever code it carries).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def local_path(source: str, revision: str | None, token: str | bool | None) -> Path:
    """A local directory with the whole target (hub repos are downloaded into the HF cache: the target runs),
    checked by `check_target_dir` before transformers sees it."""
    path = Path(source).expanduser()
    if path.is_dir():
        if revision:
            raise SourceError(f"--revision applies to hub repos; {path} is a local directory")
        return check_target_dir(path)
    listed = open_checkpoint(
        source, revision, token
    )  # clear errors for missing repos / revisions first (and the index)
    from huggingface_hub import snapshot_download

    try:
        with network.checked_answer("snapshot_download", SourceError):  # `{}` or a page for the file listing
            local = snapshot_download(
                source,
                revision=revision,
                token=token,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"],
            )
        missing = sorted(f for f in set(listed.weight_map.values()) if not (Path(local) / f).is_file())
        if missing:  # the listing snapshot_download read left out what model_info listed
            raise SourceError(
                f"the download of {source} lacks {missing[0]}, which the Hub listed a moment before: its listing "
                "was not the Hub's answer; check HF_ENDPOINT and proxies"
            )
        return check_target_dir(Path(local))
    except Exception as exc:  # network / auth after huggingface_hub's retries
        if line := network.not_the_hubs_download(exc):
            raise SourceError(line) from exc
        if network.is_network_error(exc):
            raise SourceError(network.describe(exc)) from exc
        if isinstance(exc, SourceError | CheckpointError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"could not download target {source}: {first}") from exc


def check_target_dir(path: Path) -> Path:
    """Refuse a target directory transformers must not be handed: no config object, an index naming shards outside
    the directory (or missing ones), or weights only as pickles. Returns `path`."""
    read_config(path)
    index = path / INDEX_FILE
    if index.is_file():
        raw = read_json_file(index, CheckpointError)
        for file in sorted(set(parse_index(raw, str(index)).values())):
            if not (path / file).is_file():
                raise CheckpointError(f"shard {file} is named in {index} but does not exist")
        return _headers_read(path)
    if (path / SINGLE_FILE).is_file():
        return _headers_read(path)
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"target {path} holds its weights only as pickles ({', '.join(pickles[:3])}): mtp2draft never loads "
            "pickles; convert them to safetensors first"
        )
    raise CheckpointError(f"target {path} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def _headers_read(path: Path) -> Path:
    """`path` once every shard's safetensors header is parsed and consistent with the file's size (the reader
    `convert` and `inspect` use): a corrupt or truncated shard is one line, not a traceback from transformers."""
    ckpt = open_checkpoint(path)
    for file in sorted(set(ckpt.weight_map.values())):
        ckpt.header(file)
    return path


def check_draft_fits(draft, target: TargetModel, where: str | Path) -> None:
    """Refuse a draft made for another target: a different family, hidden size or vocabulary would train to a
    meaningless loss or accept nothing, silently."""
    made_for = getattr(getattr(draft, "spec", None), "name", None)
    if made_for is None:
        made_for = (draft.draft_config().get("mtp2draft") or {}).get("spec")
    if made_for and made_for != target.spec.name:
        raise DraftError(f"{where} was made for a {made_for} target; {target.source} is a {target.spec.name} model")
    for what, mine, theirs in (
        ("hidden size", draft.hidden_size, target.hidden_size),
        ("vocabulary", draft.vocab_size, target.vocab_size),
    ):
        if mine != theirs:
            raise DraftError(f"{where} has {what} {mine}, the target {target.source} has {theirs}: not its draft")
    aux = getattr(draft, "aux_layer_ids", None)
    if aux and max(aux) >= target.num_layers:
        raise DraftError(
            f"{where} reads aux layers {aux}, but the target {target.source} has {target.num_layers} layers"
        )


def refuse_missing_weights(source: str | Path, model_type: str, missing: Iterable[str]) -> None:
    """Refuse a trunk that transformers built with parameters the checkpoint does not hold: they would be randomly
    initialised and every figure computed from them wrong, silently (transformers only logs it, and the MTP keys'
    "unexpected" lines are silenced around the load). A release that stores a trunk weight under another name than
    transformers' class reads (MiMo-V2's fused `qkv_proj` where `mimo_v2_flash` has q/k/v) is refused here."""
    missing = sorted(missing)
    if missing:
        raise CheckpointError(
            f"{source}: transformers' {model_type} trunk reads {len(missing)} weight(s) the checkpoint does not hold "
            f"(first: {missing[0]}), which would be random; mtp2draft cannot run this target's trunk yet"
        )


# top-level config.json fields a nested text config's model still reads (the loader's quantiser, the head tying)
_TOP_LEVEL = ("quantization_config", "tie_word_embeddings")


def trunk_class(spec: Spec, config: dict, fields: dict, source: str) -> tuple[type, str, dict]:
    """The transformers auto class that loads the target's trunk, the model type its config is built as and the
    fields it is built from: the spec's model type's causal-LM class with `fields`; where transformers has none for
    it, the release's own model type's image-text-to-text class with the whole config.json (GLM-OCR: glm_ocr_text
    has no causal-LM class, glm_ocr is GlmOcrForConditionalGeneration, whose decoder is the text model). A target
    transformers has neither class for (Step-5's step3p5v) is refused in one line."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    model_type = spec.config.transformers_model_type
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM, model_type, fields
    release = config.get("model_type")
    if release in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText, release, config
    raise CheckpointError(
        f"{source}: transformers has no class that runs a {release} trunk (no causal-LM class for {model_type}, no "
        f"image-text-to-text class for {release}); mtp2draft cannot run this target's trunk yet"
    )


class TargetModel:
    """A frozen transformers target that returns `Features` for token ids."""

    def __init__(
        self,
        source: str,
        revision: str | None = None,
        token: str | bool | None = None,
        dtype: str | torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        device_map: str | dict | None = None,
    ) -> None:
        from mtp2draft.draft.block_config import hf_config as build_hf_config
        from mtp2draft.target.device import check_device

        dtype = target_dtype(dtype)
        if device_map is None:
            check_device(device)  # before any download: a missing device is one line, not a traceback
        self.source = source
        self.path = local_path(source, revision, token)
        config = read_config(self.path)
        self.raw_config = config
        load_from = self.path
        if needs_dequantised_view(config):  # a quantised release: its trunk as the engines compute it (no quantiser)
            self._view = tempfile.TemporaryDirectory(prefix="mtp2draft-dequantised-")
            load_from = dequantised_view(self.path, Path(self._view.name))
            config = read_config(load_from)
        self.spec: Spec = find_spec(config, trunk_only=True)  # a DSpark release is a target like any other
        text = self.spec.text_config(config)
        # A nested text config (Qwen3.5's text_config) is the one the spec's transformers model type parses: built
        # from the whole file, its sizes were the class defaults and transformers' generation setup failed on the
        # `text_config` dict left on it. The file's top-level quantisation and head tying still apply.
        fields = (
            {**{k: config[k] for k in _TOP_LEVEL if k in config}, **text} if self.spec.config.text_config else config
        )
        auto_class, model_type, fields = trunk_class(self.spec, config, fields, source)
        kwargs = {k: v for k, v in fields.items() if k not in ("architectures", "model_type", "auto_map")}
        kwargs = open_time_step_limit(kwargs, dtype)
        # The spec names the transformers model type that parses this config (e.g. MiMo is Qwen2 in transformers),
        # so no remote code is ever run.
        hf_config = build_hf_config(model_type, kwargs, f"{self.path}/config.json")
        try:
            with quiet_transformers():  # the MTP keys are "unexpected" to the trunk class: expected here
                self.model, loading = auto_class.from_pretrained(
                    str(load_from),
                    config=hf_config,
                    dtype=dtype,
                    device_map=device_map,
                    trust_remote_code=False,
                    use_safetensors=True,  # never fall back to pickles
                    output_loading_info=True,
                    key_mapping=trunk_key_mapping(self.spec) or None,  # a multimodal release's language_model.*
                )
        except (ImportError, ValueError) as exc:
            if device_map is None and isinstance(exc, ImportError) and "accelerate" in str(exc):
                # transformers loads an FP8 release (DeepSeek-V3's quantization_config) only through accelerate
                raise OptionError(
                    f"{source} is quantised ({config.get('quantization_config', {}).get('quant_method', '?')}): "
                    "transformers loads it only with accelerate: pip install 'mtp2draft[device-map]'"
                ) from None
            if device_map is None:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OptionError(f"--device-map {device_map}: {first}") from exc
        refuse_missing_weights(source, self.spec.config.transformers_model_type, loading.get("missing_keys") or ())
        if device_map is None:
            self.model.to(device)
        self.model.eval()
        self.model.requires_grad_(False)  # frozen: no optimizer may ever update it
        self.device = next(self.model.parameters()).device  # Features come back here (a device map's first device)
        self.dtype = dtype
        self.num_layers = self.spec.num_layers(config)
        self.hidden_size = int(text["hidden_size"])
        self.vocab_size = int(text["vocab_size"])
        decoder = self.model.get_decoder()
        self._layers = decoder.layers
        # the final norm: `norm` on most trunks; Nemotron-H's is `norm_f` (the module the spec's target_norm names)
        self._norm = getattr(decoder, "norm", None) or getattr(decoder, self.spec.keys.target_norm.split(".")[-2])
        self.commit = commit_of(self.path)

    # -- weights the drafts share --
    def embedding(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def fingerprint(self) -> str:
        """sha256 over every parameter and buffer: proves the target was not written to."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    # -- forward: the one way the frozen target is run (distill, dump-hidden, evaluate) --
    def new_cache(self):
        """An empty KV cache for `run(..., cache=...)` (incremental decoding)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.no_grad()  # not inference_mode: the draft's autograd graph takes these tensors as inputs
    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        aux_layers: Sequence[int] | None = None,
        want_final: bool = True,
        final: str | None = None,
        cache=None,
    ) -> Features:
        """Run the target over input_ids [B, T]; capture what the drafts read with forward hooks.

        aux_layers: 0-based "output of layer i" ids (what EAGLE-3's fc fuses). final: which final hidden to capture,
        `pre_norm` or `post_norm` (a native draft's `input_hidden`); default: the spec's `[layer] hidden`.
        cache: None runs the whole batch; a `new_cache()` appends input_ids after the tokens it holds (decoding).
        Returns Features with fp32 logits [B, T, V], all on `self.device`. Nothing is written to the model: hooks
        only read outputs."""
        captured: dict[str, torch.Tensor] = {}
        hooks = []

        def keep(name: str):
            def hook(_module, _inputs, output):
                captured[name] = (output[0] if isinstance(output, tuple) else output).detach()

            return hook

        for i in set(aux_layers or ()):
            hooks.append(self._layers[i].register_forward_hook(keep(f"aux{i}")))
        if want_final:
            if (final or self.spec.layer.hidden) == Hidden.PRE_NORM:
                hooks.append(self._layers[self.num_layers - 1].register_forward_hook(keep("final")))
            else:
                hooks.append(self._norm.register_forward_hook(keep("final")))
        try:
            out = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask,
                cache=cache,
                use_cache=cache is not None,
            )
        finally:
            for h in hooks:
                h.remove()
        here = self.device  # under a device map, layers (and so their outputs) live on several devices
        aux = torch.cat([captured[f"aux{i}"].to(here) for i in aux_layers], dim=-1) if aux_layers else None
        final = captured["final"].to(here) if "final" in captured else None
        return Features(final=final, aux=aux, logits=out.logits.float().to(here))

    features = run  # the name distillation and `dump-hidden` use: `run` over a whole batch (no cache)


def open_time_step_limit(fields: dict, dtype: torch.dtype) -> dict:
    """`fields` with Mamba-2's time-step bounds (`time_step_limit`) past `dtype`'s range read as the infinity they
    stand for. Nemotron-3 Ultra's config.json writes [0.0, 1e308] (JSON has no Infinity); transformers' PyTorch
    Mamba-2 path (CPU, or a GPU without mamba_ssm) hands it to torch.clamp on a tensor of `dtype`, which refuses a
    bound that dtype cannot hold. Every value of `dtype` lies inside such a bound, so the clamp is the same."""
    limit = fields.get("time_step_limit")
    if not isinstance(limit, (list, tuple)):
        return fields
    top = torch.finfo(dtype).max
    bounds = [math.copysign(math.inf, v) if isinstance(v, (int, float)) and abs(v) > top else v for v in limit]
    return {**fields, "time_step_limit": bounds}


def target_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A `--dtype` name (dtypes.DTYPE_NAMES) or a torch dtype -> the torch dtype; any other name is refused."""
    if isinstance(dtype, torch.dtype):
        return dtype
    known = TORCH_DTYPES
    if dtype not in known:
        raise OptionError(f"--dtype must be one of {', '.join(known)}, got {dtype!r}")
    return known[dtype]


def commit_of(path: Path) -> str | None:
    """The hub commit a snapshot directory belongs to (its folder name in the HF cache), else None."""
    parts = path.resolve().parts
    if len(parts) >= 2 and parts[-2] == "snapshots" and len(parts[-1]) == 40:
        return parts[-1]
    return None
