"""`export --format speculators-mtp`, loaded by speculators 0.9.0 itself (marker `engine`, `.ci/run`).

For a tiny target of each family speculators' `mtp` type serves (Qwen3-Next: MoE; Qwen3.5: nested text config,
dense; Qwen3.5-MoE), a native draft whose weights differ from the target's MTP layer (as distillation leaves it) is
exported, and ONE subprocess in speculators' own venv (mtp2draft engine install speculators; tests/speculators_driver.py) runs
`SpeculatorModel.from_pretrained` on each export, speculators' `MTPConverter` on the target, and
`MTPDraftModel.forward` on fixed inputs. Checked:
- the loaded model holds exactly the draft's tensors (bit for bit, fp32 export), and the verifier's embedding and
  head, read through the verifier the config names;
- the undistilled draft's export holds exactly what speculators' own converter extracts from the target;
- the reference computation is speculators' `MTPDraftModel.forward` (teacher-forced steps, each fed the previous
  step's final-normed output); mtp2draft's `NativeMtpDraft` on the same weights and inputs must give its logits.
Without speculators' venv the test skips, except under CI (`CI` set), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.references import tensors

from mtp2draft.conversion import convert
from mtp2draft.draft.disk import load_draft
from mtp2draft.formats import ExportConfig
from mtp2draft.formats.export import export
from mtp2draft.formats.speculators_mtp import speculators_name

pytestmark = pytest.mark.engine

DRIVER = Path(__file__).resolve().parents[1] / "speculators_driver.py"
FIXTURES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
STEPS, SEQ = 3, 12  # speculative steps (the export's k) and the length of the forward's inputs
ATOL = 1e-5  # fp32, two transformers releases (ours and speculators' 5.19.0) running the same decoder layer


def _perturbed(draft: Path) -> None:
    """Move every weight of a draft off the target's MTP layer (a stand-in for distillation)."""
    state = load_file(str(draft / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    save_file(
        {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in state.items()}, str(draft / "model.safetensors")
    )


def _prepare(build, root: Path, fixture: str) -> dict:
    target = build(fixture)
    job = {"name": fixture, "target": str(target), "out": str(root / fixture / "speculators")}
    for name in ("raw", "tuned"):
        convert(str(target), root / fixture / f"{name}-draft", to="mtp", dtype="float32")
    _perturbed(root / fixture / "tuned-draft")
    settings = ExportConfig(dtype="float32", speculative_tokens=STEPS, verifier=str(target))
    for name in ("raw", "tuned"):
        export(root / fixture / f"{name}-draft", "speculators-mtp", root / fixture / name, config=settings)
    g = torch.Generator().manual_seed(0)
    hidden = int(
        json.loads((root / fixture / "tuned" / "config.json").read_text())["transformer_layer_config"]["hidden_size"]
    )
    inputs = {
        "input_ids": torch.randint(2, 256, (1, SEQ), generator=g),
        "hidden_states": torch.randn(1, SEQ, hidden, generator=g),
    }
    save_file(inputs, str(root / fixture / "inputs.safetensors"))
    return {**job, "export": str(root / fixture / "tuned"), "inputs": str(root / fixture / "inputs.safetensors")}


def _native_logits(draft: Path, embed: torch.Tensor, head: torch.Tensor, inputs: dict) -> list[torch.Tensor]:
    """mtp2draft's NativeMtpDraft run as MTPDraftModel.forward runs: step s reads token embeddings of ids[s+1 : s+1+L]
    and the previous step's final-normed output (the verifier's hidden at step 0), positions 0..L-1, L = T - S - 1."""
    module = load_draft(draft).attach_target(embed, head)
    ids, current = inputs["input_ids"], inputs["hidden_states"]
    length = ids.shape[1] - STEPS - 1
    positions = torch.arange(length)[None]
    logits = []
    with torch.no_grad():
        for s in range(STEPS):
            embeds = torch.nn.functional.embedding(ids[:, s + 1 : s + 1 + length], embed)
            normed, _ = module.layer_forward(embeds, current[:, :length], positions)
            logits.append(module.logits(normed))
            current = normed
    return logits


def test_speculators_loads_the_export_and_computes_what_the_draft_computes(
    speculators: Path, build, tmp_path: Path
) -> None:
    jobs = [_prepare(build, tmp_path, fixture) for fixture in FIXTURES]
    (tmp_path / "request.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": ""}  # nothing of mtp2draft's venv in speculators' process
    done = subprocess.run(
        [str(speculators), str(DRIVER), str(tmp_path / "request.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["versions"]["speculators"] == "0.9.0"
    for job in jobs:
        fixture, out = job["name"], Path(job["out"])
        assert reply["jobs"][fixture] == {
            "class": "MTPDraftModel",
            "config_class": "MTPSpeculatorConfig",
            "dtype": "torch.float32",
            "steps": STEPS,
            "logit_steps": STEPS,
        }, fixture
        loaded = load_file(str(out / "loaded.safetensors"))
        draft = {
            speculators_name(k): v
            for k, v in load_file(str(tmp_path / fixture / "tuned-draft" / "model.safetensors")).items()
        }
        assert sorted(set(loaded) - set(draft)) == ["embed_tokens.weight", "lm_head.weight"], fixture
        for name, tensor in draft.items():
            assert torch.equal(loaded[name], tensor), (fixture, name)
        target = tensors(Path(job["target"]))
        embed_key = next(k for k in target if k.endswith("embed_tokens.weight") and not k.startswith("mtp."))
        embed, head = target[embed_key].float(), target.get("lm_head.weight", target[embed_key]).float()
        assert torch.equal(loaded["embed_tokens.weight"], embed) and torch.equal(loaded["lm_head.weight"], head)
        converted = load_file(str(out / "converted.safetensors"))
        raw = load_file(str(tmp_path / fixture / "raw" / "model.safetensors"))
        assert sorted(converted) == sorted(raw), fixture
        for name, tensor in raw.items():
            assert torch.equal(converted[name].float(), tensor), (fixture, name)
        reference = load_file(str(out / "logits.safetensors"))  # speculators' MTPDraftModel.forward
        ours = _native_logits(tmp_path / fixture / "tuned-draft", embed, head, load_file(job["inputs"]))
        for s, logits in enumerate(ours):
            torch.testing.assert_close(logits, reference[f"step_{s}"], atol=ATOL, rtol=0, msg=f"{fixture} step {s}")
