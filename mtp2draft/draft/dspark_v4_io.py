"""A DeepSeek-V4 DSpark drafter to and from its tensors under the release's names, and a fresh one for a V4 target
that ships an MTP layer and no DSpark drafter.

- `load_dspark_v4(path, target_embedding, target_head)` reads the directory `convert` writes for a DSpark release
  (`conversion.dspark`: model.safetensors under `mtp.{i}.*`, config.json with `num_stages` and `target_config`).
  Names map through `DSparkV4Draft.GLUE` (the head stack and the context fusion) and the family spec's block
  rename table and load transforms (the stage blocks, as for the family's MTP layer). A tensor nothing maps to, one
  the module lacks, or a shape the config does not imply is refused in one DraftError line.
- `release_tensors(draft)` is the inverse (the spec's inverse rename and transforms, `layout.native_to_checkpoint`),
  and `save_dspark_v4(draft, out)` writes it with a config.json that `load_dspark_v4` reads back.
- `init_dspark_v4_from_mtp(mtp, fields, ...)` builds stages for a target whose checkpoint has a V4 MTP layer
  (`hyper.HyperMtpDraft`): every stage block a copy of the MTP block (init "mtp"), or all seeded random (init
  "random"). See its docstring for what has no counterpart and how it starts.

What this module does not do: quantise (export writes the release's quantisation), or read a hub checkpoint
(`convert` does, `conversion.dspark`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mtp2draft.draft.dspark_v4 import DSparkV4Draft
from mtp2draft.draft.layout import native_to_checkpoint
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields, dspark_fields
from mtp2draft.family.transforms import LOAD_TRANSFORMS, check_spec_transforms, group_block_keys
from mtp2draft.kinds import CONFIG_FILE, DSPARK_KIND, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.outputs.writer import save_tensors

_STAGE_OF = {"first": lambda n: 0, "last": lambda n: n - 1}


def _prefix(draft: DSparkV4Draft, stage: int) -> str:
    return draft.spec.key(draft.spec.keys.block, draft.target_config, stage)


def _glue_names(draft: DSparkV4Draft) -> dict[str, str]:
    """module key -> release name of the tensors outside the stage blocks."""
    return {
        module_key: _prefix(draft, _STAGE_OF[stage](draft.num_stages)) + rel
        for module_key, (stage, rel) in DSparkV4Draft.GLUE.items()
    }


def _short(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")


def module_state(draft: DSparkV4Draft, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Release-named tensors -> `draft`'s state dict keys, every tensor used once; DraftError (one line) naming the
    tensors nothing maps to, the module tensors none gives, or a shape that differs from the module's."""
    check_spec_transforms(draft.spec)
    spec = draft.spec
    glue = {release: module_key for module_key, release in _glue_names(draft).items()}
    state: dict[str, torch.Tensor] = {}
    left = dict(tensors)
    for release, module_key in glue.items():
        if release in left:
            state[module_key] = left.pop(release)
    for stage in range(draft.num_stages):
        prefix = _prefix(draft, stage)
        rel = [k[len(prefix) :] for k in left if k.startswith(prefix)]
        for g in group_block_keys(rel, dict(spec.block.rename), spec.block.load):
            parts = [left.pop(prefix + k) for k in g.ckpt_keys]
            transform = LOAD_TRANSFORMS[g.transform] if g.transform else None
            state[f"layers.{stage}.{g.module_key}"] = transform.combine(g, parts) if transform else parts[0]
    want = draft.state_dict()
    unknown = sorted(left) + sorted(k for k in state if k not in want)
    if unknown:
        raise DraftError(f"tensors the {draft.num_stages}-stage DSpark drafter does not use: {_short(unknown)}")
    missing = sorted(set(want) - set(state))
    if missing:
        raise DraftError(f"the DSpark drafter lacks tensors for: {_short(missing)}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(want[key].shape):
            raise DraftError(f"{key}: shape {list(tensor.shape)}, the config implies {list(want[key].shape)}")
    return state


def release_tensors(draft: DSparkV4Draft) -> dict[str, torch.Tensor]:
    """`draft`'s state under the release's names (the inverse of `module_state`)."""
    state = {k: v.detach() for k, v in draft.state_dict().items()}
    glue = _glue_names(draft)
    out = {glue[k]: state.pop(k) for k in list(state) if k in glue}
    for stage in range(draft.num_stages):
        head = f"layers.{stage}."
        block = {"block." + k[len(head) :]: state.pop(k) for k in list(state) if k.startswith(head)}
        out.update(native_to_checkpoint(draft.spec, draft.target_config, stage, block))
    if state:
        raise DraftError(f"module tensors with no release name: {_short(sorted(state))}")
    return out


def draft_config(draft: DSparkV4Draft, dtype: str = "float32") -> dict[str, Any]:
    """config.json of a dspark directory as `conversion.dspark` writes it (the fields `load_dspark_v4` reads)."""
    return {
        "draft_kind": DSPARK_KIND,
        "architectures": draft.target_config.get("architectures"),
        "dspark": draft.fields.summary(),
        "num_stages": draft.num_stages,
        "torch_dtype": dtype,
        "target_config": with_dspark_keys(draft.target_config, draft.fields),
    }


def with_dspark_keys(target_config: Mapping[str, Any], fields: DSparkFields) -> dict[str, Any]:
    """The target's config carrying `fields` as `dspark_*` keys (a drafter made for a target without one is written
    as a release would describe it, so it reads back the same way)."""
    out = dict(target_config)
    section = out
    if "text_config" in fields.section:
        out["text_config"] = section = dict(out["text_config"])
    names = {
        "block_size": "dspark_block_size",
        "target_layer_ids": "dspark_target_layer_ids",
        "noise_token_id": "dspark_noise_token_id",
        "markov_rank": "dspark_markov_rank",
        "n_routed_experts": "dspark_n_routed_experts",
        "num_experts_per_tok": "dspark_num_experts_per_tok",
    }
    for field, value in fields.summary().items():
        if value is not None:
            section[names[field]] = value
    return out


def load_dspark_v4(
    path: str | Path,
    target_embedding: torch.Tensor,
    target_head: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> DSparkV4Draft:
    """The DSpark drafter of a dspark directory (`convert`'s output, or `save_dspark_v4`'s), the target's embedding
    [V, H] and head [V, H] attached. Tensors the release stores in float32 (the hc mixers, the sinks, the
    confidence head) stay float32; the rest become `dtype`."""
    path = Path(path)
    config = json.loads((path / CONFIG_FILE).read_text())
    if config.get("draft_kind") != DSPARK_KIND:
        raise DraftError(f"{path} is not a dspark draft directory (draft_kind {config.get('draft_kind')!r})")
    target_config = config.get("target_config")
    fields = dspark_fields(target_config) if isinstance(target_config, Mapping) else None
    if fields is None:
        raise DraftError(f"{path / CONFIG_FILE} has no target_config with the dspark_* fields")
    draft = DSparkV4Draft(target_config, fields, int(config.get("num_stages", 0)))
    state = module_state(draft, load_file(str(path / WEIGHTS_FILE)))
    draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    if dtype != torch.float32:  # what the release stores in float32 stays float32
        for name, tensor in draft.state_dict(keep_vars=True).items():
            if state[name].dtype != torch.float32:
                tensor.data = tensor.data.to(dtype)
    return draft.attach_target(target_embedding, target_head)


def write_dspark_v4(draft: DSparkV4Draft, out: Path) -> None:
    """Write `draft` into the existing directory `out` under the release's names (model.safetensors, config.json)."""
    tensors = {k: v.contiguous() for k, v in release_tensors(draft).items()}
    save_tensors(out / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
    dtypes = {str(v.dtype).removeprefix("torch.") for v in tensors.values() if v.dtype != torch.float32}
    write_json(out / CONFIG_FILE, draft_config(draft, dtypes.pop() if len(dtypes) == 1 else "float32"))


def save_dspark_v4(draft: DSparkV4Draft, out: str | Path, overwrite: bool = False) -> Path:
    """Write `draft` as a new dspark directory `out` (atomically; `overwrite` as every output)."""
    with atomic_output_dir(out, overwrite) as tmp:
        write_dspark_v4(draft, tmp)
    return Path(out)
