"""Whether a draft belongs to a target: the target config the draft recorded at conversion against the target's own.

Every field of the (text) config counts, new and missing ones included, except the few listed in `INERT_FIELDS`,
compared after one normalisation applied to both sides alike (`normalised`): the RoPE settings, which releases spell
in several equivalent ways (a legacy `rope_scaling` with `type`, transformers 5's `rope_parameters`, `rope_theta` and
`partial_rotary_factor` beside or inside them), are gathered into one set of `rope.<field>` entries. Nothing else is rewritten:
what a field changes is not for a hand-written list to guess (RoPE base, norm epsilon, rope scaling, head dims,
router settings, sliding windows all change the computation), so only fields that provably do not are exempt, and
`tests/test_identity.py` proves it by mutating every key of the bundled targets in turn and finding each command
either refusing or giving bit-identical output.

Used before any weight is loaded by `evaluate`, `distill` (online target), the native exports that read `--target`
(`stitched`, `nextn`), `validate --target` and `run`.

What this module does not do: check a draft's own fields (`draft_config.py`) or a dump's (the dump reader).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mtp2draft.draft.config import DraftConfig
from mtp2draft.errors import DraftError
from mtp2draft.target.rope_config import normalised

# Config fields that never change what the target or the draft computes here: bookkeeping (the library version that
# wrote the file, where it was loaded from), the stored dtype (mtp2draft computes in the dtype it chooses: fp32 for
# the target; exports take dtypes from the target's shard headers), the KV-cache switch (a generation setting;
# evaluation passes its own cache) and the init range (weights are loaded, never initialised).
INERT_FIELDS = frozenset(
    {"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache", "initializer_range"}
)
# How the weights are stored, not what the model is: a quantised re-release of the checkpoint a draft came from is the
# target people serve its draft on (its weights are read dequantised, as the engines read them: `target/hidden.py`),
# so `quantization_config` alone never makes it another model. `inspect`'s release check says how it is stored.
STORAGE_FIELDS = frozenset({"quantization_config"})
_MISSING = object()


def _flat(spec_name: str | None, config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's fields (`normalised`), a nested text config's (Qwen3.5's `text_config`) as
    `text_config.<key>`."""
    from mtp2draft.family.spec import get_spec

    nested = get_spec(spec_name).config.text_config if spec_name else ""
    out = normalised({k: v for k, v in config.items() if not (nested and k == nested)})
    if nested and isinstance(config.get(nested), Mapping):
        out.update({f"{nested}.{k}": v for k, v in normalised(config[nested]).items()})
    return out


def config_differences(spec_name: str | None, recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Every computation-relevant field where `actual` (the target's config.json) differs from `recorded` (the one
    the draft was converted from): 'key: draft's value vs target's value', sorted."""
    mine, theirs = _flat(spec_name, recorded), _flat(spec_name, actual)
    out = []
    for key in sorted(set(mine) | set(theirs)):
        if key.rsplit(".", 1)[-1] in INERT_FIELDS or key.rsplit(".", 1)[-1] in STORAGE_FIELDS:
            continue
        a, b = mine.get(key, _MISSING), theirs.get(key, _MISSING)
        if a != b or type(a) is not type(b):
            shown = ["(absent)" if v is _MISSING else repr(v) for v in (a, b)]
            out.append(f"{key} {shown[0]} (draft) vs {shown[1]} (target)")
    return out


def check_target_identity(draft: DraftConfig, target_config: Mapping[str, Any], target: str) -> None:
    """Refuse `target` for `draft` when the draft recorded a target config that differs from the target's in any
    field that changes the computation (one DraftError line, the first differences named). A draft without a
    record (an EAGLE-3 draft converted by an older version, or from elsewhere) is checked on what it carries: the
    family, hidden size and vocabulary."""
    from mtp2draft.family.spec import find_spec

    found = find_spec(target_config)
    if draft.spec and draft.spec != found.name:
        raise DraftError(f"{draft.where} was made for a {draft.spec} target; {target} is a {found.name} checkpoint")
    text = found.text_config(target_config)
    for name, mine in (("hidden_size", draft.hidden_size), ("vocab_size", draft.vocab_size)):
        if mine is not None and mine != text.get(name):
            raise DraftError(
                f"{draft.where} has {name} {mine}, the target {target} has {text.get(name)}: not its draft"
            )
    if draft.target_config is None:
        return
    where = f"the target {draft.where} was converted from"
    check_same_checkpoint(draft.spec or found.name, draft.target_config, target_config, target, where)


def check_same_checkpoint(
    spec_name: str | None, recorded: Mapping[str, Any], actual: Mapping[str, Any], target: str, recorded_as: str
) -> None:
    """Refuse `target` (its config.json `actual`) where it differs from the checkpoint `recorded_as` (config
    `recorded`) in a field that changes the computation: one DraftError line naming the first differences."""
    diffs = config_differences(spec_name, recorded, actual)
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise DraftError(
            f"{target} is not {recorded_as}: {'; '.join(diffs[:3])}{more}; "
            "use that target, or convert the draft again from this one"
        )


def check_drafts_belong(
    drafts: Iterable[str | Path], target: Any, revision: str | None, token: str | bool | None
) -> None:
    """Each draft directory's config checked (`draft_config`) and its recorded target compared with `target`'s
    config (a hub id or local directory, or a loaded `TargetModel`): one line before any weight is loaded."""
    from mtp2draft.checkpoint.reader import read_config
    from mtp2draft.draft.config import load_draft_config
    from mtp2draft.target.hidden import local_path

    if hasattr(target, "raw_config"):  # a loaded TargetModel
        config, name = target.raw_config, target.source
    else:  # the directory the target will run from (downloaded once, checked: no pickles, no reads outside)
        config, name = read_config(local_path(str(target), revision, token)), str(target)
    for path in drafts:
        check_target_identity(load_draft_config(path), config, name)
