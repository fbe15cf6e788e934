"""`dump-hidden --engine vllm`: the target's hidden states computed by vLLM's extraction in its own venv
(`speculative_config={"method": "extract_hidden_states"}` + its hidden-states kv-connector), so a target that only
fits an engine serving it across GPUs (`tensor_parallel_size`) can be dumped. It writes through the same writer as
`--engine transformers` (`target.hidden.TargetModel`), `dumps.dump_hidden_states`, into the same format
(docs/formats.md, "hidden states"): `VllmTarget` is a `TargetModel`-shaped view of the engine's files.

What vLLM's extraction captures and how this module maps it onto mtp2draft's terms (aux id i is vLLM's i + 1; the
final norm applied here; MiMo shown to vLLM as Qwen2, the family's `[engines.vllm] extract_view`; the CPU build's
connector; why the CPU build refuses a multi-stream target, `cpu_streams_refusal`) is in docs/engines.md, "Dumping
hidden states through vLLM", each fact with the vLLM version it was read from.

What this module does not do: pick the engine (`choice.py`), install vLLM (`environments.py`), write the format
itself (`target/dumps.py` does), or tokenise (`data.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtp2draft.engines.environments import EngineUnavailable
from mtp2draft.engines.vllm_launch import VLLM_SIDE, vllm_environment, vllm_python
from mtp2draft.errors import OptionError
from mtp2draft.kinds import Hidden
from mtp2draft.settings import DumpConfig, HubAccess, Placement

if TYPE_CHECKING:
    from mtp2draft.family.schema import Spec


def extract_view(target: Path, out: Path, spec: Spec) -> Path:
    """`target` as vLLM's extraction can load it: for a family whose `[engines.vllm]` table has an `extract_view`
    or `extract_drop`, a directory of symlinks with a rewritten config.json and index and filtered copies of the
    shards holding dropped tensors. Returns the directory to serve (`target` itself when nothing needs changing)."""
    facts = spec.engine("vllm")
    if facts is None or not (facts.extract_view or facts.extract_drop):
        return target
    config = json.loads((target / "config.json").read_text())
    from safetensors import safe_open
    from safetensors.torch import save_file

    drop = tuple(facts.extract_drop)
    out.mkdir(parents=True, exist_ok=True)
    index_path = target / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    shards = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    for path in target.iterdir():
        if path.is_file() and path.name not in shards and path.name not in ("config.json", index_path.name):
            (out / path.name).symlink_to(path.resolve())
    for shard in shards:
        with safe_open(str(target / shard), "pt") as fh:
            keys = list(fh.keys())  # noqa: SIM118 - safe_open handles are not iterable
            if not any(k.startswith(drop) for k in keys):
                (out / shard).symlink_to((target / shard).resolve())
                continue
            save_file({k: fh.get_tensor(k) for k in keys if not k.startswith(drop)}, str(out / shard), {"format": "pt"})
    if index:
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(drop)}
        (out / index_path.name).write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps({**config, **facts.extract_view}, indent=2))
    return out


def vllm_layer_ids(aux_layers: Sequence[int], num_layers: int, want_final: bool) -> list[int]:
    """vLLM's extraction ids (input of layer id), ascending as vLLM returns them, for mtp2draft's aux ids (output of
    layer i) and the final hidden (num_layers: after the last layer, before the norm)."""
    return sorted({i + 1 for i in aux_layers} | ({num_layers} if want_final else set()))


def has_vllm_cpu_v4_kernels() -> bool:
    """Whether vLLM's CPU build loads its full kernel library (`vllm/_C.abi3.so`, which alone holds the DeepSeek-V4
    kernels) on this host: x86 with AVX512-BF16, the test `CpuPlatform.import_kernels` makes (vllm-cpu 0.32.0)."""
    import platform

    import torch

    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return platform.machine().lower() in ("x86_64", "amd64") and bool(check and check())


def cpu_streams_refusal(target: Any) -> str | None:
    """Why vLLM's CPU build cannot dump a multi-stream target's residual streams on this host (one line), or None
    on a GPU build. Facts of vllm-cpu 0.32.0, the model load checked by tests/testing/test_engine_vllm.py."""
    from mtp2draft.engines.environments import detect_platform, pins

    if detect_platform() != "cpu":
        return None
    version = next((p for p in pins("vllm", "cpu") if p.startswith("vllm")), "vLLM's CPU build")
    what = f"{target.spec.name}'s {target.streams} residual streams"
    if not has_vllm_cpu_v4_kernels():
        return (
            f"--engine vllm cannot dump {what} on this CPU ({version}): vLLM's DeepSeek-V4 CPU kernels "
            "(convert_weight_packed, bmm_cpu, flash_mla_with_kvcache_cpu) are only in vllm/_C.abi3.so, which it "
            "loads on AVX512-BF16 CPUs only (platforms/cpu.py import_kernels), so loading the model stops at "
            "models/deepseek_v4/cpu/cpu_sparse.py:322 (no torch.ops._C.convert_weight_packed); "
            "use --engine transformers"
        )
    return (
        f"--engine vllm cannot dump {what} on the CPU build ({version}): its DeepSeek-V4 attention keeps an "
        "fp8_ds_mla KV cache whatever --dtype (models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype), a "
        "computation not checked against the model's; use --engine transformers"
    )


def stream_slots(target: Any, num_layers: int) -> list[int]:
    """The extraction ids whose slots carry a multi-stream target's residual streams (`vllm_side/stream_capture.py`):
    any `target.streams` distinct valid ids, the last layers'; one line where the build or the request cannot."""
    if why := cpu_streams_refusal(target):
        raise EngineUnavailable(why)
    if target.aux_layers:
        raise OptionError(f"{target.spec.name} has no EAGLE-3 conversion: dump its streams without --aux-layers")
    if num_layers < target.streams:
        raise OptionError(f"{num_layers} trunk layers give fewer extraction slots than {target.streams} streams")
    return list(range(num_layers - target.streams + 1, num_layers + 1))


class VllmTarget:
    """What `dumps.dump_hidden_states` reads from a target, computed by vLLM for a fixed list of sequences.

    Construction runs the engine over every sequence (files in a temporary directory beside `out`); `features`
    then serves them in order, one sequence per call, as `TargetModel.features` would."""

    def __init__(
        self,
        source: str,
        sequences: Sequence[Sequence[int]],
        config: DumpConfig,
        work: Path,
        *,
        where: Placement = Placement(),
        hub: HubAccess = HubAccess(),
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`config`: what to extract (aux layers, final hidden, top-k); `where`: the tensor parallel size and the
        dtype vLLM runs the target in (default float32, the dump's); `hub`: the target's revision and the token."""
        from mtp2draft.checkpoint.reader import open_checkpoint, read_config
        from mtp2draft.draft.layout import plan_mtp_layer, target_embed_key, target_head_key
        from mtp2draft.family.spec import find_spec
        from mtp2draft.target.hidden import commit_of, local_path

        self.source = source
        self.path = local_path(source, hub.revision, hub.token)  # checked as TargetModel checks it
        self.raw_config = read_config(self.path)
        self.spec = find_spec(self.raw_config)
        text = self.spec.text_config(self.raw_config)
        self.num_layers = self.spec.num_layers(self.raw_config)
        self.hidden_size, self.vocab_size = int(text["hidden_size"]), int(text["vocab_size"])
        self.commit = commit_of(self.path)
        self.final = config.final or self.spec.layer.hidden
        self.aux_layers = list(config.aux_layers or [])
        ckpt = open_checkpoint(self.path)
        plan = plan_mtp_layer(ckpt, self.spec, 0)
        keys = {
            "embed": target_embed_key(ckpt, self.spec, plan),
            "head": target_head_key(ckpt, self.spec, plan),
            "norm": self.spec.key(self.spec.keys.target_norm, ckpt.config, 0),
        }
        weights = ckpt.read_weights(set(keys.values()))
        self._embed, self._head, self._norm = (weights[keys[n]] for n in ("embed", "head", "norm"))
        self._eps = float(text.get("rms_norm_eps", 1e-6))
        self.streams = self.spec.num_streams(self.raw_config)
        self.ids = (
            stream_slots(self, self.num_layers)
            if self.streams
            else vllm_layer_ids(self.aux_layers, self.num_layers, want_final=True)
        )
        self.work, self._next, self._sequences = Path(work), 0, [list(map(int, s)) for s in sequences]
        self.vllm_version = self._run(where.tensor_parallel_size or 1, where.dtype or "float32", config.top_k, progress)

    def _run(self, tensor_parallel_size: int, dtype: str, top_k: int, progress: Callable[[str], None]) -> str:
        import torch

        python = vllm_python()
        model = extract_view(self.path, self.work / "view", self.spec)
        request = {
            "model": str(model.resolve()),
            "dtype": dtype,
            "max_model_len": max(len(s) for s in self._sequences) + 1,
            "tensor_parallel_size": int(tensor_parallel_size),
            "layer_ids": self.ids,
            "top_k": int(min(top_k, self.vocab_size)),
            "sequences": self._sequences,
            "out": str(self.work.resolve()),
            # vLLM 0.32.0's stock connector copies through CUDA streams and pinned memory
            "connector": "stock" if torch.cuda.is_available() else "cpu",
        }
        req, rep = self.work / "request.json", self.work / "reply.json"
        req.write_text(json.dumps(request))
        progress(f"vLLM: extracting hidden states of {len(self._sequences)} sequences (layer ids {self.ids})")
        env = vllm_environment(pythonpath=VLLM_SIDE, model=model)
        if self.streams:  # vllm_side/stream_capture.py: the residual streams in the extraction slots
            env["MTP2DRAFT_VLLM_STREAMS"] = str(self.streams)
        done = subprocess.run(
            [str(python), str(VLLM_SIDE / "dump_driver.py"), str(req), str(rep)],
            env=env,
            cwd=self.work,
            stdout=sys.stderr,  # vLLM's log is progress: to stderr
        )
        if done.returncode != 0 or not rep.is_file():
            raise EngineUnavailable(f"vLLM's hidden-state extraction failed (exit {done.returncode}; its log is above)")
        return json.loads(rep.read_text())["vllm_version"]

    # -- what dumps.dump_hidden_states reads of a TargetModel --
    def embedding(self):
        return self._embed

    def lm_head(self):
        return self._head

    def features(self, input_ids, attention_mask=None, aux_layers=None, want_final: bool = True, final=None):
        """The next sequence's `Features` ([1, T, ...]); `input_ids` [1, T] must be that sequence."""
        import torch
        from safetensors.torch import load_file

        from mtp2draft.target.hidden import Features

        n = self._next
        self._next += 1
        if list(aux_layers or []) != self.aux_layers or (final or self.spec.layer.hidden) != self.final:
            raise OptionError("VllmTarget was built for other aux layers or another final hidden")
        hidden = load_file(str(self.work / f"{n}.hidden.safetensors"))
        if hidden["token_ids"].tolist() != input_ids[0].tolist() or n >= len(self._sequences):
            raise RuntimeError(f"vLLM's hidden states for sequence {n} belong to other tokens")
        states = hidden["hidden_states"].float()  # [T, len(ids), H], ids ascending
        if self.streams:  # slot s holds stream s: [T, hc_mult, H], what the MTP layer consumes
            top = load_file(str(self.work / f"{n}.logprobs.safetensors"))
            values, ids = top["topk_logprobs"][None], top["topk_ids"][None]
            return Features(states[None, :, : self.streams], None, topk_logprobs=values, topk_ids=ids)
        pick = {layer: states[:, j] for j, layer in enumerate(self.ids)}
        top = load_file(str(self.work / f"{n}.logprobs.safetensors"))
        aux = torch.cat([pick[i + 1] for i in self.aux_layers], dim=-1)[None] if self.aux_layers else None
        values, ids = top["topk_logprobs"][None], top["topk_ids"][None]  # [1, T, k]: vLLM's, already sorted
        return Features(self._final(pick[self.num_layers])[None], aux, topk_logprobs=values, topk_ids=ids)

    def _final(self, pre_norm):
        """[T, H] the final hidden the dump keeps: vLLM's pre-norm state, or it through the target's final RMSNorm
        (fp32; `zero_centered` norms scale by 1 + w, as the spec says of the family's norms)."""
        import torch

        if self.final == Hidden.PRE_NORM:
            return pre_norm
        scale = 1 + self._norm if self.spec.layer.norm == "zero_centered" else self._norm
        return pre_norm * torch.rsqrt(pre_norm.pow(2).mean(-1, keepdim=True) + self._eps) * scale


def dump_hidden_in_vllm(
    target: str,
    sequences: Sequence[dict[str, Any]],
    out: str | Path,
    config: DumpConfig = DumpConfig(),
    *,
    where: Placement = Placement(),
    hub: HubAccess = HubAccess(),
    **write: Any,
) -> Path:
    """`dump-hidden --engine vllm`: the target's hidden states extracted by vLLM (`VllmTarget`), written by
    `dumps.dump_hidden_states` with `config` and `write` (overwrite, progress, inputs)."""
    from mtp2draft.outputs.claims import claim_output
    from mtp2draft.outputs.directories import check_output_dir
    from mtp2draft.target.dumps import dump_hidden_states

    out = Path(out)
    # refuse before the engine runs for minutes (dump_hidden_states checks again, with the target's directory), and
    # claim --out for the engine's run too: a second dump into it is refused at once, not after the extraction
    check_output_dir(out, write.get("overwrite", False), [*write.get("inputs", ()), target])
    progress = write.get("progress") or (lambda _: None)
    with claim_output(out), tempfile.TemporaryDirectory(prefix=".mtp2draft-vllm-", dir=out.parent) as work:
        ids = [s["input_ids"] for s in sequences]
        vt = VllmTarget(target, ids, config, Path(work), where=where, hub=hub, progress=progress)
        progress(f"vLLM {vt.vllm_version}: hidden states extracted; writing {out}")
        return dump_hidden_states(vt, sequences, out, config, **write)
