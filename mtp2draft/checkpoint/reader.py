"""Resolve a SOURCE (hub repo id or local directory) and read only the tensors a conversion needs.

Order of work, so a 700 GB checkpoint costs the MTP layer's bytes and little more:
1. config.json and model.safetensors.index.json (the index maps every key to its shard);
2. the safetensors header of each shard that holds a needed key (8 bytes, then the JSON header);
3. the byte ranges of the needed tensors, coalesced per shard.
From the Hub, step 2 and 3 are HTTP range requests through huggingface_hub's session, cached on disk per commit so a
second run fetches nothing. Locally, shards that hold no needed key are never opened.

FP8 block weights (`float8_e4m3fn` with an fp32 `<name>_scale_inv` sibling of shape [ceil(M/b), ceil(N/b)]) are
dequantised as `W[i, j] * scale_inv[i // b, j // b]` in fp32 by `read_weights` (the arithmetic is in `checkpoint/fp8.py`, the
byte sources, local files and cached Hub ranges, in `checkpoint/sources.py`). The other schemes (DeepSeek-V4's FP4 /
e8m0, NVFP4, MXFP4, compressed-tensors int4 / int8) are picked from config.json by `checkpoint/quant.py`: callers ask
for logical keys (`...q_proj.weight`), the reader fetches the stored parts and yields the dequantised weight.

What this module does not do: know anything about MTP layers or families (that is `family/spec.py` / `conversion.py`), or
download whole shards.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import torch

from mtp2draft.checkpoint import network
from mtp2draft.checkpoint.fp8 import (
    SCALE_SUFFIX,
    dequantize_fp8,
    fp8_block_size,
)
from mtp2draft.checkpoint.quant import QuantMethod, QuantView, QuantWeight, TensorScheme, quant_method
from mtp2draft.checkpoint.sources import HubFiles, LocalFiles, check_inside, range_cache_dir
from mtp2draft.dtypes import ST_DTYPES
from mtp2draft.errors import CheckpointError, Mtp2DraftError, SourceError, read_json_object
from mtp2draft.manifest import write_text_safely

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files some releases keep their MTP layers in without naming them in the index (MiMo-V2.5, Nemotron-3 Nano:
# `model_mtp.safetensors`): top-level files matching this are found by listing the repo's files (the Hub call that
# resolves the commit already lists them) or the directory, and read with the same range reads.
UNINDEXED_MTP_FILES = "*mtp*.safetensors"

# Gap (bytes) up to which two needed tensors of one shard are fetched with a single range request.
COALESCE_GAP = 4096
# Largest range fetched (and held) at once when reading runs of adjacent tensors.
MAX_RUN_BYTES = 16 << 20


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: shard file, dtype, shape and absolute byte range in the file."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ---- the checkpoint -----------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A resolved SOURCE with its config, index and (lazily) shard headers."""

    source: str
    files: LocalFiles | HubFiles
    config: dict[str, Any]
    weight_map: dict[str, str]
    revision: str | None = None
    commit: str | None = None
    file_sizes: dict[str, int | None] = field(default_factory=dict)
    read_headers: dict[str, dict[str, TensorInfo]] = field(default_factory=dict, repr=False)
    quant_method: QuantMethod = field(init=False, repr=False)
    _view: QuantView | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.quant_method = quant_method(self.config)  # an unknown scheme is refused here, in one line

    @property
    def quant(self) -> QuantView:
        """The index seen through the config's quantisation (logical keys; built on first use, from names)."""
        if self._view is None:
            self._view = QuantView(self.quant_method, self.weight_map)
        return self._view

    unindexed: dict[str, int] = field(default_factory=dict)
    """Files the index does not name whose tensors were added to `weight_map` (`UNINDEXED_MTP_FILES`): file -> count."""
    fp8_row_chunks: dict[str, int] = field(default_factory=dict)
    """FP8 weights stored pre-sharded in row chunks, whose scales may be tiled per chunk (`fp8.py`): key -> chunks;
    set by the layer plan from the spec (a fused qkv_proj's geometry)."""

    @property
    def is_local(self) -> bool:
        return isinstance(self.files, LocalFiles)

    @property
    def bytes_fetched(self) -> int:
        return self.files.bytes_fetched if isinstance(self.files, HubFiles) else self.files.bytes_read

    def total_bytes(self) -> int:
        """Size of all shards named by the index (the whole checkpoint's weights)."""
        return sum(self.file_sizes.get(f) or 0 for f in set(self.weight_map.values()))

    # -- headers --
    def header(self, file: str) -> dict[str, TensorInfo]:
        if file not in self.read_headers:
            self.read_headers[file] = self._read_header(file)
        return self.read_headers[file]

    def _read_header(self, file: str) -> dict[str, TensorInfo]:
        size = self.files.size(file)
        if size is None:
            raise CheckpointError(f"shard {file} is named in the index but is missing from {self.files.describe()}")
        if size < 8:
            raise CheckpointError(f"{file}: truncated safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", self.files.read(file, 0, 8))
        if n == 0 or 8 + n > size or n > 100 * 2**20:
            raise CheckpointError(f"{file}: corrupt safetensors header (declares {n} header bytes, file has {size})")
        raw = self.files.read(file, 8, 8 + n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{file}: corrupt safetensors header (not JSON: {exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{file}: corrupt safetensors header (not a JSON object)")
        base = 8 + n
        infos = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (a, b) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{file}: corrupt header entry for {name}: {entry!r}") from exc
            if dtype not in ST_DTYPES:
                raise CheckpointError(f"{file}: tensor {name} has unsupported dtype {dtype}")
            if b - a != math.prod(shape) * ST_DTYPES[dtype][1] or base + b > size or a < 0:
                raise CheckpointError(
                    f"{file}: header entry for {name} is inconsistent (offsets {a}-{b}, shape {list(shape)}, "
                    f"dtype {dtype}, file size {size})"
                )
            infos[name] = TensorInfo(name, file, dtype, shape, base + a, base + b)
        return infos

    # -- lookup --
    def has(self, key: str) -> bool:
        return key in self.weight_map or key in self.quant.weights

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Logical keys under `prefix`: a quantised weight's parts appear as the one weight they make up."""
        return [
            k for k in self.quant.visible(k for k in self.weight_map if k.startswith(prefix)) if k.startswith(prefix)
        ]

    def quantised(self, key: str) -> QuantWeight | None:
        return self.quant.weights.get(key)

    def scheme_of(self, key: str) -> TensorScheme | None:
        """The scheme a quantised logical key is stored in (from its data part's dtype), None for other keys."""
        weight = self.quantised(key)
        return weight.scheme(self.info(weight.data).dtype) if weight else None

    def shape_of(self, key: str) -> tuple[int, ...]:
        """The shape `read_weights` yields for `key` (a quantised weight's dequantised shape), from headers only."""
        scheme = self.scheme_of(key)
        if scheme is None:
            self.check_readable(key)
            return self.info(key).shape
        names = self.quant.weights[key].names
        params = self.quant_method.params_for(key)
        return tuple(scheme.shape({r: self.info(n).shape for r, n in names.items()}, params))

    def weight_dtype(self, key: str) -> torch.dtype:
        """The dtype `read_weights` yields before any cast: fp32 for quantised and FP8 weights, else as stored."""
        if self.quantised(key) or self.scale_key(key):
            return torch.float32
        return ST_DTYPES[self.info(key).dtype][0]

    def check_readable(self, key: str) -> None:
        """One line for a tensor that is a quantised weight's data without the parts that make it readable."""
        if self.quantised(key):
            return
        foreign = self.quant.foreign(key)
        if foreign:
            raise CheckpointError(foreign)
        if key not in self.weight_map:
            return
        dtype = self.info(key).dtype
        if key + SCALE_SUFFIX in self.weight_map or (
            ST_DTYPES[dtype][0].is_floating_point and dtype not in ("F8_E4M3", "F8_E5M2")
        ):
            return
        from mtp2draft.checkpoint.quant import SCHEMES

        for name in self.quant_method.schemes:
            scheme = SCHEMES[name]
            stem = scheme.stem_of(key)
            if stem is not None and scheme.data_template.format(stem) == key and dtype in scheme.data_dtypes:
                missing = [t.format(stem) for _, t in scheme.parts[1:] if t.format(stem) not in self.weight_map]
                if dtype.startswith("F8"):  # block FP8 reads either scale
                    raise CheckpointError(
                        f"FP8 weight {key} has no {key + SCALE_SUFFIX} (nor {' / '.join(missing)}) in the checkpoint: "
                        "cannot dequantise it"
                    )
                raise CheckpointError(
                    f"{key} is stored as {dtype} ({scheme.name}) but {' / '.join(missing)} is missing from the "
                    "checkpoint: cannot dequantise it"
                )

    def info(self, key: str) -> TensorInfo:
        file = self.weight_map.get(key)
        if file is None:
            raise CheckpointError(f"tensor {key} is not in the checkpoint index")
        header = self.header(file)
        if key not in header:
            raise CheckpointError(f"the index maps {key} to {file}, but that shard's header does not contain it")
        return header[key]

    def scale_key(self, key: str) -> str | None:
        """The `_scale_inv` sibling of an FP8 weight; error when a 1-byte float weight has none."""
        if self.quantised(key):
            return None
        info = self.info(key)
        if info.dtype not in ("F8_E4M3", "F8_E5M2"):
            return None
        scale = key + SCALE_SUFFIX
        if not self.has(scale):
            raise CheckpointError(f"FP8 weight {key} has no {scale} in the checkpoint: cannot dequantise it")
        return scale

    def fp8_block_size(self) -> tuple[int, int]:
        return fp8_block_size(self.config)

    # -- reading --
    def iter_raw(self, keys: Iterable[str], max_run_bytes: int = MAX_RUN_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """(key, tensor as stored) in file order, fetched with one range request per run of adjacent tensors
        (runs capped at `max_run_bytes` unless a single tensor is larger), so memory holds one run at a time."""
        infos = sorted((self.info(k) for k in dict.fromkeys(keys)), key=lambda i: (i.file, i.start))
        for run in _coalesce(infos, max_run_bytes):
            start, end = run[0].start, max(i.end for i in run)
            data = memoryview(self.files.read(run[0].file, start, end))
            for info in run:
                yield info.name, _decode(data[info.start - start : info.end - start], info)
            del data

    def read_raw(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """Tensors as stored (no dequantisation)."""
        return dict(self.iter_raw(keys))

    def needed_keys(self, keys: Iterable[str]) -> list[str]:
        """The stored tensors behind logical `keys`: each key, its `_scale_inv` sibling, or a quantised weight's
        parts."""
        out = []
        for key in keys:
            if self.quantised(key):
                out += self.quant.needed(key)
                continue
            out.append(key)
            scale = self.scale_key(key)
            if scale:
                out.append(scale)
        return out

    def iter_weights(
        self, keys: Iterable[str], dtype: torch.dtype = torch.float32, max_run_bytes: int = MAX_RUN_BYTES
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(key, tensor) in file order: FP8 block and quantised weights dequantised (each as soon as its last stored
        part has arrived), floating tensors cast to `dtype`, others unchanged."""
        parts_of = {key: self.needed_keys([key]) for key in dict.fromkeys(keys)}
        owner = {name: key for key, names in parts_of.items() for name in names}
        waiting: dict[str, dict[str, torch.Tensor]] = {}  # key -> the stored parts that have arrived
        for name, tensor in self.iter_raw(owner, max_run_bytes):
            key = owner[name]
            got = waiting.setdefault(key, {})
            got[name] = tensor
            if len(got) < len(parts_of[key]):
                continue
            del waiting[key]
            yield key, self._assemble(key, got, dtype)

    def _assemble(self, key: str, got: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The weight under `key` from its stored tensors `got` (name -> tensor as stored)."""
        scheme = self.scheme_of(key)
        if scheme is not None:
            names = self.quant.weights[key].names
            params = {**self.quant_method.params_for(key), "scale_key": names.get("scale")}
            tensor = scheme.dequant({r: got[n] for r, n in names.items()}, params, key)
            return check_finite(key, tensor).to(dtype)
        scale = self.scale_key(key)
        if scale is not None:
            chunks = self.fp8_row_chunks.get(key, 1)
            tensor = dequantize_fp8(got[key], got[scale], self.fp8_block_size(), key=key, chunks=chunks)
            return check_finite(key, tensor).to(dtype)
        tensor = got[key]
        return check_finite(key, tensor).to(dtype) if tensor.is_floating_point() else tensor

    def read_weights(self, keys: Iterable[str], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Tensors by key (see `iter_weights`)."""
        keys = list(dict.fromkeys(keys))
        got = dict(self.iter_weights(keys, dtype))
        return {k: got[k] for k in keys}

    def bytes_for(self, keys: Iterable[str]) -> int:
        return sum(self.info(k).nbytes for k in self.needed_keys(keys))


def check_finite(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or a CheckpointError when it holds NaN / Inf: a damaged weight would otherwise convert "exactly" and
    poison every draft made from it."""
    from mtp2draft.checkpoint.tensor_checks import nonfinite_counts

    counts = nonfinite_counts(tensor)
    if counts is not None:
        nan, inf = counts
        raise CheckpointError(
            f"{key} holds non-finite values ({nan} NaN, {inf} Inf of {tensor.numel()}): the checkpoint is damaged"
        )
    return tensor


def _coalesce(infos: list[TensorInfo], max_bytes: int = 1 << 62) -> Iterator[list[TensorInfo]]:
    run: list[TensorInfo] = []
    for info in infos:
        if run and (
            info.file != run[-1].file
            or info.start - max(i.end for i in run) > COALESCE_GAP
            or info.end - run[0].start > max_bytes
        ):
            yield run
            run = []
        run.append(info)
    if run:
        yield run


def _decode(data: bytes | bytearray | memoryview, info: TensorInfo) -> torch.Tensor:
    """A tensor viewing `data` (no copy; it keeps the buffer alive)."""
    dtype, _ = ST_DTYPES[info.dtype]
    if not len(data):
        return torch.empty(info.shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(info.shape)


# ---- resolution ---------------------------------------------------------------------------------------------------
def open_checkpoint(
    source: str | os.PathLike, revision: str | None = None, token: str | bool | None = None
) -> Checkpoint:
    """Resolve SOURCE: an existing local directory, else a hub repo id (with optional revision)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if revision:
            raise SourceError(f"--revision applies to hub repos; {path} is a local directory")
        return _open_local(path)
    if path.exists():
        raise SourceError(f"{path} is a file; SOURCE must be a checkpoint directory or a hub repo id")
    return _open_hub(hub_repo_id(str(source)), revision, token)


# What a Hub repo id is, said when a SOURCE is neither a directory nor one (huggingface_hub's `validate_repo_id`).
REPO_ID_RULE = (
    "a repo id is `name` or `org/name`: letters, digits, `-`, `_`, `.`, no `--` or `..`, at most 96 characters"
)


def hub_repo_id(text: str) -> str:
    """`text` as a Hub repo id, once no directory of that name exists; otherwise one line naming both things tried:
    "directory `./my model` does not exist, and it is not a Hub repo id (...)". A path-like text (`./x`, `/x`,
    `~/x`, `a/b/c`) is never taken for a repo id: the user meant a directory."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    shown = text if text.isprintable() else repr(text)  # a newline in a name must not break the one line
    path_like = not text or text.startswith((".", "/", "~")) or text.count("/") > 1
    try:
        if path_like:
            raise HFValidationError(text)
        validate_repo_id(text)
    except HFValidationError:
        raise SourceError(
            f"directory `{shown}` does not exist, and `{shown}` is not a Hub repo id ({REPO_ID_RULE})"
        ) from None
    return text


def _open_local(root: Path) -> Checkpoint:
    files = LocalFiles(root)
    config = read_config(root)
    weight_map = _weight_map_local(root, files)
    sizes = {f: files.size(f) for f in set(weight_map.values())}
    ckpt = Checkpoint(str(root), files, config, weight_map, file_sizes=sizes)
    add_unindexed_files(ckpt, [p.name for p in root.iterdir() if p.is_file()])
    return ckpt


def add_unindexed_files(ckpt: Checkpoint, names: Iterable[str]) -> None:
    """Add to `ckpt.weight_map` the tensors of the top-level files among `names` (the repo's or directory's file
    list) that match `UNINDEXED_MTP_FILES` and that the index does not name; only their headers are read here. A
    tensor such a file shares with the index is refused in one line: which copy is the checkpoint's is not ours to
    guess."""
    indexed = set(ckpt.weight_map.values())
    extra = sorted(n for n in names if "/" not in n and fnmatch.fnmatch(n, UNINDEXED_MTP_FILES) and n not in indexed)
    for file in extra:
        keys = sorted(ckpt.header(file))
        clash = [k for k in keys if k in ckpt.weight_map]
        if clash:
            raise CheckpointError(
                f"{file}, which {INDEX_FILE} does not list, holds {clash[0]}, which the index places in "
                f"{ckpt.weight_map[clash[0]]}: refusing to guess which copy is the checkpoint's"
            )
        ckpt.weight_map.update(dict.fromkeys(keys, file))
        ckpt.file_sizes[file] = ckpt.files.size(file)
        ckpt.unindexed[file] = len(keys)


def _weight_map_local(root: Path, files: LocalFiles) -> dict[str, str]:
    index = root / INDEX_FILE
    if index.is_file():
        return parse_index(read_json_object(index, CheckpointError), INDEX_FILE)
    if (root / SINGLE_FILE).is_file():
        ckpt = Checkpoint(str(root), files, {}, {}, file_sizes={})
        return {k: SINGLE_FILE for k in ckpt.header(SINGLE_FILE)}
    raise CheckpointError(f"{root} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def parse_index(index: dict[str, Any], where: str) -> dict[str, str]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{where} has no valid 'weight_map'")
    for file in set(weight_map.values()):
        check_shard_name(file, where)
    return dict(weight_map)


def check_shard_name(file: str, where: str, inside: str = "the checkpoint") -> None:
    """A shard named by an index (or a dump's manifest: `inside`) must be a plain relative name inside the
    directory: no absolute path, no `..`.

    Checked by name, never by resolving: HF cache snapshots are symlinks into the blob store, and those are fine."""
    parts = PurePosixPath(file).parts
    if (
        not file
        or "\\" in file
        or "\0" in file
        or PurePosixPath(file).is_absolute()
        or PureWindowsPath(file).drive
        or any(part in ("..", ".") for part in parts)
    ):
        raise CheckpointError(f"{where} names the shard {file!r}, which lies outside {inside}: refusing to read it")


def read_config(root: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory: a JSON object, or one line saying why not."""
    if (root / "config.json").is_file():
        check_inside(root, root / "config.json")
    return read_json_object(root / "config.json", CheckpointError, f"{root} has no config.json")


def _open_hub(repo_id: str, revision: str | None, token: str | bool | None) -> Checkpoint:
    from huggingface_hub import HfApi, constants, hf_hub_download

    where = f"{repo_id}" + (f"@{revision}" if revision else "")
    network.configure()
    try:
        if constants.HF_HUB_OFFLINE:
            commit, sizes = _offline_commit(repo_id, revision)
        else:
            with network.checked_answer("model_info", SourceError):
                info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
                if not isinstance(info.sha, str) or not info.sha or not isinstance(info.siblings, list | None):
                    raise KeyError("sha")  # a commit to fetch from is the one thing this answer must say
            commit = info.sha
            sizes = {s.rfilename: s.size for s in (info.siblings or [])}
        names = set(sizes)

        def fetch_json(name: str) -> dict[str, Any]:
            local = hf_hub_download(repo_id, name, revision=commit, token=token)
            return read_json_object(Path(local), CheckpointError)

        if "config.json" not in names:
            raise SourceError(f"hub repo {where} has no config.json: not a transformers checkpoint")
        config = fetch_json("config.json")
        files = HubFiles(repo_id, commit, sizes, token)
        if INDEX_FILE in names:
            weight_map = parse_index(fetch_json(INDEX_FILE), f"{where}/{INDEX_FILE}")
        elif SINGLE_FILE in names:
            probe = Checkpoint(repo_id, files, {}, {}, file_sizes=sizes)
            weight_map = {k: SINGLE_FILE for k in probe.header(SINGLE_FILE)}
        else:
            raise CheckpointError(f"hub repo {where} has neither {INDEX_FILE} nor {SINGLE_FILE}")
    except Exception as exc:
        mapped = _hub_failure(exc, repo_id, revision, where)
        if mapped is exc:
            raise
        raise mapped from exc
    if not constants.HF_HUB_OFFLINE and revision != commit:
        _record_ref(repo_id, revision or "main", commit)
    ckpt = Checkpoint(repo_id, files, config, weight_map, revision=revision, commit=commit, file_sizes=sizes)
    add_unindexed_files(ckpt, names)
    # Remember the file list beside the range cache so HF_HUB_OFFLINE=1 runs can resolve this commit later.
    meta = files.cache / "files.json"
    if not meta.is_file():
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(sizes))
    return ckpt


def _hub_failure(exc: Exception, repo_id: str, revision: str | None, where: str) -> Exception:
    """The one-line error for a failure while opening hub repo `repo_id`; `exc` itself when it is not one (a bug)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, Mtp2DraftError):
        return exc
    if line := network.not_the_hubs_download(exc):  # before EntryNotFound: a page served for a file says so
        return SourceError(line)
    if isinstance(exc, RevisionNotFoundError):
        return SourceError(f"revision {revision!r} does not exist in hub repo {repo_id}")
    if isinstance(exc, GatedRepoError):
        return SourceError(f"hub repo {repo_id} is gated: accept its terms on the Hub, then log in")
    if isinstance(exc, RepositoryNotFoundError):
        return SourceError(f"hub repo {repo_id} not found (or private: log in with `hf auth login` or pass --token)")
    if isinstance(exc, EntryNotFoundError):
        return SourceError(f"hub repo {where} is missing a file: {exc}")
    if isinstance(exc, OfflineModeIsEnabled):
        return SourceError(f"{where} is not in the local cache and HF_HUB_OFFLINE is set")
    if isinstance(exc, HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return SourceError(f"hub request for {where} failed: {first}")
    if network.is_network_error(exc):
        return SourceError(network.describe(exc))
    if isinstance(exc, OSError):
        return SourceError(f"could not reach the hub for {where}: {exc}")
    return exc


def _record_ref(repo_id: str, ref: str, commit: str) -> None:
    """Write `refs/<ref>` = commit into the HF cache, as huggingface_hub does for the downloads it resolves itself:
    files are fetched here by commit sha, so without this an offline run could not tell which commit `main` is."""
    from huggingface_hub import constants

    path = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "refs" / ref
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text().strip() != commit:
            write_text_safely(path, commit)  # a fresh temporary name: a planted link is never followed
    except OSError:  # a read-only cache only costs offline reuse
        pass


def _offline_commit(repo_id: str, revision: str | None) -> tuple[str, dict[str, int | None]]:
    """Commit and file list from the hub cache alone (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    ref = folder / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    meta = range_cache_dir(repo_id, commit) / "files.json"
    if not (folder / "snapshots" / commit).is_dir() or not meta.is_file():
        raise SourceError(f"{repo_id}@{rev} is not in the local cache and HF_HUB_OFFLINE is set")
    return commit, json.loads(meta.read_text())
