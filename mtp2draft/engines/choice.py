"""Which engine runs the target for a stage (`--engine`): transformers in this process, or vLLM in its own venv.
Each stage that takes `--engine` has one call here that checks the choice and the options that go with it, then
hands the work to mtp2draft's own code (`dumps`, `decode`, `data.regenerate`) or to the vLLM module that does it
(`vllm_dump`, `vllm_evaluate`, `vllm_serve`): `dump_hidden_with`, `evaluate_with`, `regenerate_with`. The names
each `--engine` takes (`DUMP_ENGINES`, `EVALUATE_ENGINES`) are read by the CLI's help, so this module imports no
torch at import time.

What this module does not do: run an engine itself, or decide what an engine serves for a family (the spec's
`[engines.*]` table says).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtp2draft.errors import OptionError
from mtp2draft.kinds import is_dspark_draft
from mtp2draft.settings import DumpConfig, HubAccess, Placement

if TYPE_CHECKING:  # io, data and evaluation.settings' users import torch, which this module does not
    from mtp2draft.data import Example, Regeneration
    from mtp2draft.evaluation.settings import EvaluateConfig
    from mtp2draft.progress import Progress

DUMP_ENGINES: dict[str, str] = {
    "transformers": "the target loaded by transformers in this process (device_map across local GPUs)",
    "vllm": "vLLM's extract_hidden_states in its own venv (tensor parallel across GPUs)",
}
EVALUATE_ENGINES: dict[str, str] = {
    "transformers": "mtp2draft's speculative decoding, the target loaded by transformers here (--device, --device-map)",
    "vllm": "the target served with the draft by vLLM in its own venv (--tensor-parallel-size); vLLM's counters",
}


def _check(engine: str, engines: dict[str, str]) -> None:
    if engine not in engines:
        raise OptionError(f"--engine must be one of {', '.join(engines)}, not {engine!r}")


def dump_hidden_with(
    engine: str,
    target: str,
    sequences: Sequence[dict[str, Any]],
    out: str | Path,
    config: DumpConfig | None = None,
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    **write: Any,
) -> Path:
    """`dump-hidden` with the chosen engine (`DUMP_ENGINES`): `config`, what to dump (`DumpConfig`, its defaults when
    None); `where`, the tensor parallel size (vLLM's); `hub`, the target's revision and the token. `write` are
    `dumps.dump_hidden_states`'s keywords (overwrite, progress, inputs), which writes the files in both cases."""
    config, where, hub = config or DumpConfig(), where or Placement(), hub or HubAccess()
    _check(engine, DUMP_ENGINES)
    if engine == "transformers":
        from mtp2draft.target.dumps import dump_hidden_states
        from mtp2draft.target.hidden import TargetModel

        if (where.tensor_parallel_size or 1) != 1:
            raise OptionError("--tensor-parallel-size is for --engine vllm (transformers spreads with device_map)")
        return dump_hidden_states(TargetModel(target, hub.revision, hub.token), sequences, out, config, **write)
    from mtp2draft.engines.vllm_dump import dump_hidden_in_vllm

    return dump_hidden_in_vllm(target, sequences, out, config, where=where, hub=hub, **write)


def evaluate_with(
    engine: str,
    drafts: Sequence[tuple[str, str]],
    target: str,
    data: str | Path,
    config: EvaluateConfig | None = None,
    *,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress = lambda _: None,
) -> dict[str, Any]:
    """`evaluate` with the chosen engine (`EVALUATE_ENGINES`): the same report either way, plus `engine` (name,
    version). `where`: where the target runs (dtype None: float32 for transformers, the checkpoint's own for vLLM);
    `hub`: the target's revision and the token."""
    _check(engine, EVALUATE_ENGINES)
    if drafts and is_dspark_draft(drafts[0][1]):  # block drafting: its own loop (transformers only, it says so)
        from mtp2draft.evaluation.dspark import evaluate_dspark

        return evaluate_dspark(engine, drafts, target, data, config, where=where, hub=hub, progress=progress)
    where, hub = where or Placement(), hub or HubAccess()
    if engine == "transformers":
        if where.tensor_parallel_size is not None:
            raise OptionError("--tensor-parallel-size is for --engine vllm (transformers spreads with --device-map)")
        import transformers

        from mtp2draft.evaluation.decode import evaluate

        report = evaluate(drafts, target, data, config, where=where, hub=hub, progress=progress)
        return {**report, "engine": {"name": "transformers", "version": transformers.__version__}}
    for option, value in (("--device", where.device), ("--device-map", where.device_map)):
        if value is not None:
            raise OptionError(f"{option} is for --engine transformers (vLLM places the target itself; split it "
                              "with --tensor-parallel-size)")  # fmt: skip
    from mtp2draft.engines.vllm_evaluate import evaluate_in_vllm

    return evaluate_in_vllm(drafts, target, data, config, where=where, hub=hub, progress=progress)


def regenerate_with(
    engine: str,
    examples: Sequence[Example],
    target: str,
    how: Regeneration,
    *,
    eos: int | None,
    where: Placement | None = None,
    hub: HubAccess | None = None,
    progress: Progress | None = None,
) -> list[Example]:
    """`examples` with their responses replaced by the target's own (`how`: greedy or sampled, how long), written by
    `engine` (`EVALUATE_ENGINES`): transformers here (`data.regenerate`), or vLLM serving the target
    (`vllm_serve.regenerate_in_vllm`), for a target that only an engine can run. Responses end after the tokenizer's
    `eos`, which is kept. `where`: vLLM's tensor parallel size; `hub`: the target's revision and the token."""
    _check(engine, EVALUATE_ENGINES)
    where, hub = where or Placement(), hub or HubAccess()
    if engine == "transformers":
        from mtp2draft.data import load_tokenizer, regenerate
        from mtp2draft.target.hidden import TargetModel

        say = progress or (lambda _: None)
        model = TargetModel(target, hub.revision, hub.token)
        return regenerate(examples, model, load_tokenizer(model.path), how, progress=say)
    from mtp2draft.engines.vllm_serve import regenerate_in_vllm

    return regenerate_in_vllm(examples, target, how, eos=eos, where=where, hub=hub, progress=progress)
