"""Runs in speculators' own venv (mtp2draft engine install speculators), never in mtp2draft's: imports nothing of mtp2draft.

`python speculators_driver.py REQUEST.json` reads a list of jobs, and for each writes into its `out` directory what
speculators itself makes of a `speculators-mtp` export and of the target it was converted from:
- `loaded.safetensors`: the state dict of `SpeculatorModel.from_pretrained(export)` (the class is resolved from the
  config, as any speculators user loads a draft; embed_tokens / lm_head come from the verifier the config names);
- `converted.safetensors`: `MTPConverter().convert_to_state_dict(target)`, speculators' own extraction of the
  target's MTP layer (what its `convert` writes);
- `logits.safetensors` (when the job names `inputs`): `MTPDraftModel.forward(input_ids, hidden_states)` in fp32 on
  CPU, its per-step logits `step_0` ... (teacher-forced steps; the output of step s feeds step s + 1).
Prints one JSON line: versions, and per job the loaded class and dtype.

What this script does not do: compare anything (the test does, in mtp2draft's venv).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().clone() for k, v in state.items()}


def run(job: dict) -> dict:
    from speculators import SpeculatorModel
    from speculators.convert.mtp.converter import MTPConverter

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    model = SpeculatorModel.from_pretrained(job["export"])
    model.eval()
    save_file(_contiguous(model.state_dict()), str(out / "loaded.safetensors"))
    save_file(_contiguous(MTPConverter().convert_to_state_dict(job["target"])), str(out / "converted.safetensors"))
    reply = {
        "class": type(model).__name__,
        "config_class": type(model.config).__name__,
        "dtype": str(next(model.parameters()).dtype),
        "steps": model.config.num_speculative_steps,
    }
    if job.get("inputs"):
        inputs = load_file(job["inputs"])
        with torch.no_grad():
            logits, _, _ = model.float()(input_ids=inputs["input_ids"], hidden_states=inputs["hidden_states"].float())
        save_file({f"step_{i}": t.contiguous() for i, t in enumerate(logits)}, str(out / "logits.safetensors"))
        reply["logit_steps"] = len(logits)
    return reply


def main() -> int:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    replies = {job["name"]: run(job) for job in jobs}
    versions = {name: version(name) for name in ("speculators", "transformers", "torch")}
    print(json.dumps({"versions": versions, "jobs": replies}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
