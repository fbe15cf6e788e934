"""Offline hidden states: the `dump-hidden` files, written from a target and read back for distillation.

`dump_hidden_states` writes what distillation reads from any target that gives `Features` (a `hidden.TargetModel`,
or `engines.vllm_dump.VllmTarget` for vLLM's own extraction) into sharded safetensors files (schema:
docs/formats.md, "hidden states"); `OfflineHiddenStates` reads such a directory back, checked by `dump_checks` when
it opens and batch by batch, so a target too large for one machine is served by an engine and the draft trained
from files.

What this module does not do: load or run a target (`hidden.py`, `engines/vllm_dump.py`), or train (`train/`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from mtp2draft.errors import DataError
from mtp2draft.manifest import write_json
from mtp2draft.outputs.claims import being_written
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.outputs.identity import dir_identity
from mtp2draft.outputs.writer import save_tensors
from mtp2draft.progress import meter
from mtp2draft.settings import DumpConfig
from mtp2draft.target import dump_checks
from mtp2draft.target.hidden import HIDDEN_SCHEMA_VERSION, MANIFEST, SHARED_FILE, Features, TargetModel


def dump_hidden_states(
    target: TargetModel,
    sequences: Sequence[dict[str, Any]],
    out: str | Path,
    config: DumpConfig = DumpConfig(),
    *,
    overwrite: bool = False,
    progress=lambda _: None,
    inputs: Sequence[str | Path | None] = (),
) -> Path:
    """Write what distillation reads into sharded safetensors files (schema: docs/formats.md, "hidden states").

    config: the aux layers, top-k and shard size, and which final hidden to store (`pre_norm` | `post_norm`, a native
    draft's `input_hidden`; default: the spec's `[layer] hidden`). inputs: the other local paths the command reads (data file, draft): `out` may not be,
    contain or lie in one of them, nor in the target's directory, so `--overwrite` can never delete them.

    Each sequence n is stored as `{n}.input_ids` [T] int64, `{n}.loss_mask` [T] bool, `{n}.final` [T, H],
    `{n}.aux` [T, 3H] (when aux layers are given), `{n}.topk_logprobs` [T, k] fp32 and `{n}.topk_ids` [T, k] int64.
    `shared.safetensors` holds the target's embedding and lm_head so distillation never loads the target."""
    aux_layers, top_k, shard_size, final = list(config.aux_layers or []), config.top_k, config.shard_size, config.final
    dump_checks.check_dump_options(top_k, shard_size)
    dump_checks.check_aux_layers(aux_layers, target.num_layers, target.source)
    with atomic_output_dir(out, overwrite, [*inputs, target.source, target.path]) as tmp:
        shards: list[dict[str, Any]] = []
        buffer: dict[str, torch.Tensor] = {}
        held: list[int] = []

        def flush() -> None:
            name = f"hidden-{len(shards):05d}.safetensors"
            save_tensors(tmp / name, buffer)
            shards.append({"file": name, "sequences": list(held)})
            buffer.clear()
            held.clear()

        bar = meter(progress, "dump-hidden", len(sequences), "sequence")
        for n, seq in enumerate(sequences):
            ids = torch.as_tensor(seq["input_ids"], dtype=torch.int64)[None]  # [1, T]
            feats = target.features(ids, aux_layers=aux_layers or None, final=final)
            if feats.logits is not None:
                logprobs = torch.log_softmax(feats.logits[0], dim=-1)  # [T, V]
                values, indices = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)  # [T, k]
            else:  # an engine that returns its top-k log-probs only (engines.vllm_dump.VllmTarget)
                values, indices = feats.topk_logprobs[0][:, :top_k], feats.topk_ids[0][:, :top_k]  # [T, k]
            buffer[f"{n}.input_ids"] = ids[0]
            buffer[f"{n}.loss_mask"] = torch.as_tensor(seq["loss_mask"], dtype=torch.bool)
            buffer[f"{n}.final"] = feats.final[0].float().contiguous()
            if feats.aux is not None:
                buffer[f"{n}.aux"] = feats.aux[0].float().contiguous()
            buffer[f"{n}.topk_logprobs"] = values.contiguous()
            buffer[f"{n}.topk_ids"] = indices.contiguous()
            record = {k.split(".", 1)[1]: v for k, v in buffer.items() if k.startswith(f"{n}.")}
            problem = dump_checks.record_problem(record, target.vocab_size)
            if problem:  # a damaged target: no dump that distill would refuse is written
                raise DataError(f"the target {target.source}, sequence {n}: {problem}: is the target damaged?")
            held.append(n)
            if len(held) == shard_size or n == len(sequences) - 1:
                flush()
            bar.update(1)
        bar.close()
        save_tensors(tmp / SHARED_FILE, {"embed": target.embedding().float(), "lm_head": target.lm_head().float()})
        write_json(
            tmp / MANIFEST,
            {
                "schema_version": HIDDEN_SCHEMA_VERSION,
                "target": target.source,
                "target_commit": target.commit,
                "target_config": target.raw_config,
                "spec": target.spec.name,
                "final": final or target.spec.layer.hidden,
                "aux_layer_ids": aux_layers,
                "top_k": top_k,
                "num_sequences": len(sequences),
                "hidden_size": target.hidden_size,
                "vocab_size": target.vocab_size,
                "shards": shards,
            },
        )
    return Path(out)


class OfflineHiddenStates:
    """Reads a `dump-hidden` directory; serves `Features` for batches of stored sequences.

    The manifest, the shard names and every shard's header are checked when it opens (`dump_checks`), and every
    batch as it is read: a damaged dump is one line naming the file (and record), before or instead of a step.
    max_length: the tokens a run reads per sequence (a dump with no loss token within them is refused)."""

    def __init__(self, path: str | Path, max_length: int | None = None) -> None:
        self.path = Path(path)
        if being_written(self.path):
            raise DataError(
                f"the dump {self.path} is being written by another mtp2draft run (`dump-hidden --overwrite`?): "
                "train on it when that run ends"
            )
        self.identity = dir_identity(self.path) if self.path.is_dir() else None  # as first read (`_check_same`)
        self.manifest = dump_checks.read_manifest(self.path)
        self.where = dump_checks.check_shards(self.path, self.manifest, max_length)
        self.raw_config = self.manifest["target_config"]
        self.aux_layers = list(self.manifest["aux_layer_ids"])
        self.vocab_size = int(self.manifest["vocab_size"])
        self.hidden_size = int(self.manifest["hidden_size"])
        self.source = self.manifest["target"]
        self.commit = self.manifest.get("target_commit")
        with safe_open(str(self.path / SHARED_FILE), "pt") as fh:
            self._embed, self._head = fh.get_tensor("embed"), fh.get_tensor("lm_head")
        shared = {"embed": self._embed, "lm_head": self._head}
        dump_checks.check_finite_state(shared, str(self.path / SHARED_FILE), "the dump is damaged")
        self._check_same(None)

    def _check_same(self, file: str | None) -> None:
        """Refuse a dump replaced since it was opened (`dump-hidden --out D --overwrite` while this run reads D):
        shards are reopened per batch, and records of two dumps are never mixed. file: one shard (the directory's
        inode and the shard's inode, size and mtime are compared), or None for the whole directory."""
        try:
            if file is None:
                same = dir_identity(self.path) == self.identity
            else:
                d, f = self.path.stat(), (self.path / file).stat()
                entry = (os.path.normpath(file), f.st_ino, f.st_size, f.st_mtime_ns)
                same = self.identity is not None and (d.st_dev, d.st_ino) == self.identity[:2]
                same = same and entry in self.identity[2]
        except OSError:
            same = False
        if not same:
            raise DataError(
                f"the dump {self.path} was replaced while this run read it (by `dump-hidden --overwrite`?): "
                "stopped before mixing records of two dumps; train again on the new dump"
            )

    def __len__(self) -> int:
        return int(self.manifest["num_sequences"])

    def embedding(self) -> torch.Tensor:
        return self._embed

    def lm_head(self) -> torch.Tensor:
        return self._head

    def sequence(self, n: int) -> dict[str, torch.Tensor]:
        """Record n, read from its shard; the shard is checked to be the one opened, before and after the read."""
        self._check_same(self.where[n])
        with safe_open(str(self.path / self.where[n]), "pt") as fh:
            names = list(fh.keys())  # noqa: SIM118 - safe_open handles are not iterable
            record = {k.split(".", 1)[1]: fh.get_tensor(k) for k in names if k.split(".")[0] == str(n)}
        self._check_same(self.where[n])
        return record

    def iter_sequences(self) -> Iterator[dict[str, torch.Tensor]]:
        for n in range(len(self)):
            yield self.sequence(n)


def pad_stack(tensors: list[torch.Tensor], length: int, value: float = 0) -> torch.Tensor:
    """Right-pad [T_i, ...] tensors to `length` and stack: [B, length, ...]."""
    out = tensors[0].new_full((len(tensors), length, *tensors[0].shape[1:]), value)
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t[:length]
    return out


def offline_features(store: OfflineHiddenStates, indices: Sequence[int], length: int) -> tuple[dict, Features]:
    """A padded batch of stored sequences: ({input_ids, loss_mask, attention_mask}, Features)."""
    seqs = [store.sequence(int(i)) for i in indices]
    dump_checks.check_batch(store, indices, seqs)  # before any step can consume it
    lengths = [min(s["input_ids"].shape[0], length) for s in seqs]
    t = max(lengths)
    batch = {
        "input_ids": pad_stack([s["input_ids"] for s in seqs], t),
        "loss_mask": pad_stack([s["loss_mask"] for s in seqs], t, False),
        "attention_mask": pad_stack([torch.ones(n, dtype=torch.int64) for n in lengths], t),
    }
    features = Features(
        final=pad_stack([s["final"] for s in seqs], t),
        aux=pad_stack([s["aux"] for s in seqs], t) if "aux" in seqs[0] else None,
        topk_logprobs=pad_stack([s["topk_logprobs"] for s in seqs], t, -math.inf),
        topk_ids=pad_stack([s["topk_ids"] for s in seqs], t),
    )
    return batch, features
