"""Checks of `dump-hidden` directories, the one on-disk input distillation reads that this run did not write.

Before training starts, once, from small reads only:
- `manifest.json`: a JSON object with every field of the schema (docs/formats.md, "hidden states") of the right type,
  consistent with itself (sizes against its own `target_config`, sequences 0..N-1 each stored once, `top_k` >= 1)
  and with the draft it is meant to train (family, sizes, layers, the target's whole config for native drafts);
- shard names: plain relative names (the checkpoint index rule, `checkpoint.reader.check_shard_name`) that stay inside the
  dump once links are followed;
- shard headers (8 bytes + the JSON header each, through `checkpoint.tensors.Checkpoint`'s header reader): every record's
  tensors present with the schema's dtype and shapes ([T], [T, H], [T, 3H], [T, k]); `shared.safetensors` [V, H];
- loss masks (one byte per token): a dump with no loss token within --max-length trains nothing and is refused.
Then, per batch as it is consumed (the dump is read once): finiteness of the features and log-probs, log-probs <= 0
(`LOGPROB_TOLERANCE`), token ids within the vocabulary and distinct within each position's top-k, record by record
(one pass each).

What this module does not do: read the dump for training (`dumps.OfflineHiddenStates`), decide what a failing rank
does under torchrun (`parallel.together`), or check checkpoints (`checkpoint.py`) and drafts (`draft.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.reader import check_shard_name
from mtp2draft.checkpoint.sources import LocalFiles
from mtp2draft.checkpoint.tensor_checks import check_tensors
from mtp2draft.checkpoint.tensors import Checkpoint, TensorInfo
from mtp2draft.dtypes import ST_FLOATS
from mtp2draft.errors import CheckpointError, DataError, OptionError, SpecError, UnknownFamilyError, read_json_object
from mtp2draft.settings import DumpConfig
from mtp2draft.target.rope_config import normalised

MANIFEST = "manifest.json"
SHARED_FILE = "shared.safetensors"
FINALS = ("post_norm", "pre_norm")

# manifest field -> (accepted types, what the one line calls them); `target_commit` may also be null
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "schema_version": ((int,), "a whole number"),
    "target": ((str,), "a string"),
    "target_commit": ((str, type(None)), "a string or null"),
    "target_config": ((dict,), "a JSON object"),
    "spec": ((str,), "a string"),
    "final": ((str,), "a string"),
    "aux_layer_ids": ((list,), "a list"),
    "top_k": ((int,), "a whole number"),
    "num_sequences": ((int,), "a whole number"),
    "hidden_size": ((int,), "a whole number"),
    "vocab_size": ((int,), "a whole number"),
    "shards": ((list,), "a list"),
}
# the fields of each record and their safetensors dtype; `aux` only when the dump has aux layers
RECORD_DTYPES = {"input_ids": "I64", "loss_mask": "BOOL", "final": "F32", "aux": "F32"}
RECORD_DTYPES |= {"topk_logprobs": "F32", "topk_ids": "I64"}
# target config keys that do not change what the target computes (a re-save rewrites them)
IGNORED_CONFIG_KEYS = ("transformers_version", "_name_or_path")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- options of dump-hidden ---------------------------------------------------------------------------------------------
def check_dump_options(top_k: Any, shard_size: Any, max_length: Any = None) -> None:
    """dump-hidden's numeric options (max_length: None when the sequences are already cut)."""
    given = [("--top-k", top_k, 1), ("--shard-size", shard_size, 1)]
    given += [("--max-length", max_length, 2)] if max_length is not None else []
    for option, value, least in given:
        if not _whole(value) or value < least:
            raise OptionError(f"{option} must be a whole number >= {least}, got {value!r}")


def check_aux_layers(aux_layers: Sequence[int] | None, num_layers: int, source: str) -> None:
    """dump-hidden's aux layer ids: distinct "output of layer i" ids of the target's trunk."""
    aux = list(aux_layers or [])
    if not all(_whole(i) and 0 <= i < num_layers for i in aux) or len(set(aux)) != len(aux):
        raise OptionError(
            f"--aux-layers {','.join(map(str, aux))}: aux layer ids must be distinct layers in 0..{num_layers - 1} "
            f"of the target {source} ({num_layers} layers)"
        )


def check_dump_request(
    target: str,
    target_dir: Path,
    out: Path,
    config: DumpConfig,
    max_length: Any,
    *,
    overwrite: bool,
    inputs: Sequence[Path | None],
    draft: Any = None,
) -> None:
    """Everything `dump-hidden` can refuse before the target loads: its options, aux ids beyond the target, a draft
    made for another family, and an --out that is, contains or lies in an input (data, draft, the target's directory:
    `--overwrite` would delete it)."""
    from mtp2draft.checkpoint.reader import read_config
    from mtp2draft.family.spec import find_spec
    from mtp2draft.outputs.directories import check_output_dir

    check_dump_options(config.top_k, config.shard_size, max_length)
    check_output_dir(out, overwrite, [*inputs, target, target_dir])
    target_config = read_config(target_dir)
    spec = find_spec(target_config)
    check_aux_layers(config.aux_layers, spec.num_layers(target_config), target)
    if draft is not None:
        made_for = getattr(getattr(draft, "spec", None), "name", None) or (
            (getattr(draft, "eagle_config", None) or {}).get("mtp2draft") or {}
        ).get("spec")
        if made_for and made_for != spec.name:
            raise OptionError(f"--draft was made for a {made_for} target; {target} is a {spec.name} model")


def check_offline_options(job: Any) -> None:
    """distill --hidden-states reads the target's outputs from the dump: options that only an online run uses are
    refused rather than silently ignored."""
    given = [
        option
        for option, value in (
            ("--target", job.target),
            ("--data", job.data.data),
            ("--revision", job.hub.revision),
            ("--regenerate", job.data.regenerate),
            ("--sample", job.data.sample),
            ("--skip-bad", job.skip_bad),
        )
        if value
    ]
    if given:
        raise OptionError(
            f"{' and '.join(given)} cannot be used with --hidden-states (the dump holds the target's outputs): "
            "drop them, or drop --hidden-states to distill online"
        )


# ---- the manifest -----------------------------------------------------------------------------------------------------
def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the dump at `root`, checked field by field and for consistency; DataError otherwise."""
    from mtp2draft.family.spec import get_spec

    path = root / MANIFEST
    if not root.is_dir():
        raise DataError(f"--hidden-states {root} is not a directory")
    manifest = read_json_object(path, DataError, f"{root} has no {MANIFEST}: not a dump-hidden directory")
    if manifest.get("schema_version") != 1 and _whole(manifest.get("schema_version")):
        raise DataError(f"{path}: schema_version {manifest['schema_version']} is not supported (1 is)")
    for name, (types, what) in FIELDS.items():
        if name not in manifest:
            raise DataError(f"{path} has no {name!r}: not a complete dump-hidden manifest")
        value = manifest[name]
        if not isinstance(value, types) or isinstance(value, bool):
            raise DataError(f"{path}: {name} must be {what}, got {value!r}")
    if manifest["schema_version"] != 1:
        raise DataError(f"{path}: schema_version {manifest['schema_version']} is not supported (1 is)")
    for name in ("top_k", "num_sequences", "hidden_size", "vocab_size"):
        if manifest[name] < 1:
            raise DataError(f"{path}: {name} must be >= 1, got {manifest[name]}")
    if manifest["final"] not in FINALS:
        raise DataError(f"{path}: final must be one of {', '.join(FINALS)}, got {manifest['final']!r}")
    try:
        spec = get_spec(manifest["spec"])
        text = spec.text_config(manifest["target_config"])
        num_layers = spec.num_layers(manifest["target_config"])
    except (UnknownFamilyError, SpecError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: spec / target_config do not describe a target: {exc}") from exc
    for name in ("hidden_size", "vocab_size"):
        if text.get(name) != manifest[name]:
            raise DataError(f"{path}: {name} {manifest[name]} disagrees with its target_config's {text.get(name)!r}")
    check_aux_ids(manifest["aux_layer_ids"], num_layers, path)
    check_shard_list(manifest, path)
    return manifest


def check_aux_ids(aux: list[Any], num_layers: int, where: Path) -> None:
    if not all(_whole(i) and 0 <= i < num_layers for i in aux) or len(set(aux)) != len(aux):
        raise DataError(f"{where}: aux_layer_ids {aux} must be distinct layers in 0..{num_layers - 1} of its target")


def check_shard_list(manifest: dict[str, Any], where: Path) -> None:
    """`shards`: [{file, sequences}] naming files inside the dump, storing sequences 0..num_sequences-1 once each."""
    root, seen = where.parent, set()
    for entry in manifest["shards"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise DataError(
                f"{where}: every entry of shards must be {{'file': ..., 'sequences': [...]}}, got {entry!r}"
            )
        seqs = entry.get("sequences")
        if not isinstance(seqs, list) or not all(_whole(n) for n in seqs):
            raise DataError(f"{where}: shard {entry['file']!r} must list its sequences as whole numbers, got {seqs!r}")
        check_inside(root, entry["file"], where)
        for n in seqs:
            if not 0 <= n < manifest["num_sequences"]:
                raise DataError(
                    f"{where}: shard {entry['file']!r} lists sequence {n}, outside 0..{manifest['num_sequences'] - 1} "
                    f"(num_sequences {manifest['num_sequences']})"
                )
            if n in seen:
                raise DataError(f"{where}: sequence {n} is listed twice in shards")
            seen.add(n)
    if len(seen) != manifest["num_sequences"]:
        missing = []  # the first few, without building range(num_sequences): it may say 10**12
        for n in range(manifest["num_sequences"]):
            if n not in seen:
                missing.append(n)
                if len(missing) > 5:
                    break
        raise DataError(
            f"{where}: num_sequences is {manifest['num_sequences']} but shards list {len(seen)} "
            f"(missing {', '.join(map(str, missing[:5]))}{' ...' if len(missing) > 5 else ''})"
        )


def check_inside(root: Path, file: str, where: Path) -> None:
    """A file the manifest names: a plain relative name that exists inside the dump, also once links are followed."""
    try:
        check_shard_name(file, str(where), inside="the dump")
    except CheckpointError as exc:
        raise DataError(str(exc)) from None
    real, base = (root / file).resolve(), root.resolve()
    if base not in real.parents:
        raise DataError(f"{root / file} is a link that leads outside the dump ({real}): refusing to read it")
    if not real.is_file():
        raise DataError(f"shard {file} is named in {where} but does not exist")


# ---- identity: the dump and the draft -------------------------------------------------------------------------------
def check_dump_fits_draft(manifest: dict[str, Any], draft: Any, draft_config: Mapping[str, Any], where: Path) -> None:
    """Refuse a dump of another target than the draft's: family, sizes, trunk depth, token ids and (native drafts
    carry the target's whole config.json) every config key that can change the computation."""
    from mtp2draft.family.spec import get_spec
    from mtp2draft.kinds import DraftKind

    record = draft_config.get("mtp2draft") or {}
    made_for = getattr(getattr(draft, "spec", None), "name", None) or record.get("spec")
    if made_for and made_for != manifest["spec"]:
        raise DataError(
            f"{where} holds a {manifest['spec']} target's hidden states; the draft was made for a {made_for}"
        )
    for what, mine, theirs in (
        ("hidden_size", draft.hidden_size, manifest["hidden_size"]),
        ("vocab_size", draft.vocab_size, manifest["vocab_size"]),
    ):
        if mine != theirs:
            raise DataError(f"{where} was dumped from a target with {what} {theirs}; the draft has {mine}")
    target_config = manifest["target_config"]
    spec = get_spec(manifest["spec"])
    recorded_layers = record.get("target_num_layers")
    if recorded_layers is not None and recorded_layers != spec.num_layers(target_config):
        raise DataError(
            f"{where} was dumped from a target of {spec.num_layers(target_config)} layers; the draft's has "
            f"{recorded_layers}"
        )
    commit = record.get("commit")
    if commit and manifest["target_commit"] and commit != manifest["target_commit"]:
        raise DataError(
            f"{where} was dumped from commit {manifest['target_commit']} of the target; the draft was converted "
            f"from {commit}"
        )
    if draft.kind == DraftKind.MTP:
        # both records read through the same normalisation as the draft/target check (a release's legacy RoPE
        # spelling and the one transformers writes back are one setting)
        mine = normalised(getattr(draft, "target_config", None) or draft_config.get("target_config") or {})
        theirs = normalised(target_config)
        differ = sorted(
            k for k in set(mine) | set(theirs) if k not in IGNORED_CONFIG_KEYS and mine.get(k) != theirs.get(k)
        )
        if differ:
            k = differ[0]
            raise DataError(
                f"{where} was dumped from another target: its target_config has {k}={theirs.get(k)!r}, the "
                f"draft's target {mine.get(k)!r}"
                + (f" ({len(differ) - 1} more key(s) differ)" if len(differ) > 1 else "")
            )
    else:
        text = spec.text_config(target_config)
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if k in draft_config and k in text and draft_config[k] != text[k]:
                raise DataError(
                    f"{where} was dumped from another target: {k} {text[k]!r}, the draft's {draft_config[k]!r}"
                )


def final_streams(manifest: dict[str, Any]) -> list[int]:
    """[S] when a record's `final` holds S residual streams per token ([T, S, H]: a multi-stream target's last layer
    before its stream-reducing head, what DeepSeek-V4's MTP layer reads, `final` = pre_norm), else [] ([T, H])."""
    from mtp2draft.family.spec import get_spec  # imported here as the other checks do

    streams = get_spec(manifest["spec"]).num_streams(manifest["target_config"])
    return [streams] if streams and manifest["final"] == "pre_norm" else []


# ---- shards: headers, then loss masks ---------------------------------------------------------------------------------
def check_shards(root: Path, manifest: dict[str, Any], max_length: int | None = None) -> dict[int, str]:
    """Every record's tensors, from the shard headers: present, schema dtypes, consistent shapes; the shared
    embedding and head [V, H]; and at least one loss token (within `max_length`). Returns {sequence: shard file}."""
    files = LocalFiles(root)
    ckpt = Checkpoint(str(root), files, {}, {})
    h, v = manifest["hidden_size"], manifest["vocab_size"]
    k = min(manifest["top_k"], v)  # the writer keeps at most the vocabulary
    n_aux = len(manifest["aux_layer_ids"])
    streams = final_streams(manifest)
    where: dict[int, str] = {}
    masks: list[TensorInfo] = []
    for entry in manifest["shards"]:
        file = entry["file"]
        header = _header(ckpt, file)
        for n in entry["sequences"]:
            where[n] = file
            infos = {}
            for name, dtype in RECORD_DTYPES.items():
                if name == "aux" and not n_aux:
                    continue
                info = header.get(f"{n}.{name}")
                if info is None:
                    raise DataError(
                        f"{root / file}: record {n} has no {n}.{name} (the manifest lists it in this shard)"
                    )
                if info.dtype != dtype:
                    raise DataError(f"{root / file}: {n}.{name} is {info.dtype}, the schema says {dtype}")
                infos[name] = info
            ids_shape = list(infos["input_ids"].shape)
            if len(ids_shape) != 1 or ids_shape[0] < 1:
                raise DataError(f"{root / file}: {n}.input_ids has shape {ids_shape}: a record holds [T] ids, T >= 1")
            t = ids_shape[0]
            want = {"input_ids": [t], "loss_mask": [t], "final": [t, *streams, h], "aux": [t, n_aux * h]}
            want |= {"topk_logprobs": [t, k], "topk_ids": [t, k]}
            for name, info in infos.items():
                if list(info.shape) != want[name]:
                    raise DataError(
                        f"{root / file}: {n}.{name} has shape {list(info.shape)}, expected {want[name]} "
                        f"(T tokens, {f'{streams[0]} residual streams, ' if streams else ''}hidden_size {h}, "
                        f"top_k {k}{f', {n_aux} aux layers' if n_aux else ''})"
                    )
            masks.append(infos["loss_mask"])
    if (root / SHARED_FILE).exists():
        check_inside(root, SHARED_FILE, root / MANIFEST)
    shared = _header(ckpt, SHARED_FILE)
    for name in ("embed", "lm_head"):
        info = shared.get(name)
        if info is None or list(info.shape) != [v, h] or info.dtype not in ST_FLOATS:
            got = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
            raise DataError(f"{root / SHARED_FILE}: {name} must be a float tensor [{v}, {h}], got {got}")
    if not _any_loss_token(ckpt, masks, max_length):
        within = f" within --max-length {max_length}" if max_length else ""
        raise DataError(f"{root}: the loss mask is false at every position{within}: nothing to train on")
    return where


def _header(ckpt: Checkpoint, file: str) -> dict[str, TensorInfo]:
    if not ckpt.files.exists(file):
        raise DataError(f"{Path(ckpt.source) / file} does not exist: the dump is incomplete")
    try:
        return ckpt.header(file)
    except CheckpointError as exc:
        raise DataError(f"{ckpt.source}/{exc}") from None


def _any_loss_token(ckpt: Checkpoint, masks: list[TensorInfo], max_length: int | None) -> bool:
    """Whether any record has a loss token (first `max_length` positions): one small read per record, stopping at
    the first record that has one."""
    for info in masks:
        data = ckpt.files.read(info.file, info.start, info.end)
        if any(data[:max_length] if max_length else data):
            return True
    return False


# ---- per batch, as it is consumed ---------------------------------------------------------------------------------------
def check_batch(store: Any, indices: Sequence[int], seqs: list[dict[str, torch.Tensor]]) -> None:
    """Refuse a batch holding NaN / Inf features or log-probs (-inf log-probs are allowed: zero probability),
    log-probs above 0, token ids outside the vocabulary or repeated in a position's top-k: a few reductions per
    field of each record (the tensors are already in memory)."""
    for n, s in zip(indices, seqs, strict=True):
        problem = record_problem(s, store.vocab_size)
        if problem:
            raise DataError(f"{store.path / store.where[int(n)]}: record {int(n)}: {problem}: refusing to train on it")


def record_problem(record: Mapping[str, torch.Tensor], vocab_size: int) -> str | None:
    """What is wrong with one record's values (None: nothing), for the reader and for the writer."""
    for name in ("final", "aux", "topk_logprobs", "input_ids", "topk_ids"):
        if name in record and _bad(name, record[name], vocab_size):
            return _describe(name, record[name], vocab_size)
    if "topk_logprobs" in record and (p := _probability_above_one(record["topk_logprobs"])) is not None:
        return p
    if "topk_ids" in record and (p := _repeated_id(record["topk_ids"])) is not None:
        return p
    return None


# A log-probability above this is a probability above 1, not rounding (log_softmax in fp32 stays within ~1e-6 of 0).
LOGPROB_TOLERANCE = 1e-4


def _probability_above_one(t: torch.Tensor) -> str | None:
    """Top-k log-probs are log p <= 0: a positive one is not a distribution (logits or another scale written as
    log-probs), and the KL against it would train on garbage."""
    if not t.numel() or not bool((t > LOGPROB_TOLERANCE).any()):
        return None
    bad = t > LOGPROB_TOLERANCE
    return (
        f"topk_logprobs holds {int(bad.sum())} value(s) above 0 (max {float(t[bad].max()):.4g}), so probabilities "
        "above 1: they are not log-probabilities"
    )


def _repeated_id(t: torch.Tensor) -> str | None:
    """A position's top-k ids are distinct tokens: one id twice counts its probability twice."""
    if t.dim() != 2 or t.shape[-1] < 2 or not t.numel():
        return None
    ids = t.sort(dim=-1).values
    same = ids[:, 1:] == ids[:, :-1]
    if not bool(same.any()):
        return None
    row = int(same.any(dim=-1).nonzero()[0])
    token = int(ids[row, 1:][same[row]][0])
    return f"topk_ids repeats id {token} at position {row} (the top-k of a position are distinct tokens)"


def _bad(name: str, t: torch.Tensor, v: int) -> bool:
    if not t.numel():
        return False
    if name in ("input_ids", "topk_ids"):
        return bool(t.min() < 0) or bool(t.max() >= v)
    if name == "topk_logprobs":
        return bool(torch.isnan(t).any()) or bool((t == math.inf).any())
    return not bool(torch.isfinite(t).all())


def _describe(name: str, t: torch.Tensor, v: int) -> str:
    if name in ("input_ids", "topk_ids"):
        return f"{name} holds ids in {int(t.min())}..{int(t.max())}, outside the vocabulary 0..{v - 1}"
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    what = f"{nan} NaN, {inf} Inf" if name != "topk_logprobs" else f"{nan} NaN, {int((t == math.inf).sum())} +Inf"
    return f"{name} holds non-finite values ({what} of {t.numel()})"


def check_finite_state(state: Mapping[str, torch.Tensor], what: str, action: str = "refusing to write it") -> None:
    """Refuse weights holding NaN / Inf or an integer weight (whatever the cause): the shared embedding and head of a
    dump as it opens, a distilled draft before it is written. The check every reader makes (`tensor_checks`)."""
    check_tensors(what, state, action=action)
