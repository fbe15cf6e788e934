"""A `speculators-dspark` export read by vLLM 0.32's own code (marker `engine`, `.ci/run`), and why its CPU build
does not serve it.

A random Qwen3-style drafter for examples/targets/tiny-deepseek-v3 (`draft.dspark_disk.new_dspark_draft`) is exported
with the target as its verifier; ONE subprocess in vLLM's venv (tests/dspark_vllm_driver.py) runs
`SpeculatorsConfig.extract_transformers_pre_trained_config` / `extract_vllm_speculative_config` on it and asks for an
engine config serving it, then builds vLLM's own `Qwen3DSparkForCausalLM` from that config and loads the export with
its own `load_weights`. Checked:
- vLLM's reading equals `formats.dspark.vllm_view`, the facts `validate` checks without vLLM (architectures, target
  layers = aux ids - 1, anchor-first layout, mask token, block size, k = block size);
- vLLM 0.32's CPU build refuses to serve DSpark, with the cause it gives: DSpark runs only in the V2 model runner
  (`config/vllm.py` `_get_v1_model_runner_unsupported_features`: "Model Runner V1 does not support: dspark speculative
  decoding"), and the V2 runner needs Triton (`_validate_v2_model_runner`: "Model Runner V2 requires Triton."), which
  the CPU build lacks (`vllm.triton_utils.HAS_TRITON` false; the DSpark speculator's kernels are `@triton.jit`). The
  day a vLLM build serves it, this assertion fails: replace it with a serving case (greedy output equal to plain
  decoding), as tests/testing/test_engine_vllm.py does for the other formats.
- every tensor of the export lands in vLLM's module (its loader refuses an unknown name) with its value (q/k/v and
  gate/up fused as vLLM fuses them); the parameters it does not fill are exactly those it shares with the target
  (embedding, head) and its unused `mask_embedding` placeholder.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mtp2draft.draft import dspark_disk as disk
from mtp2draft.family.dspark import DSparkFields
from mtp2draft.formats import ExportConfig
from mtp2draft.formats.dspark import vllm_view
from mtp2draft.formats.export import export, validate

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "examples" / "targets" / "tiny-deepseek-v3"
DRIVER = ROOT / "tests" / "dspark_vllm_driver.py"
REFUSAL = "Model Runner V1 does not support: dspark speculative decoding"


def _shared(target: Path) -> tuple[torch.Tensor, torch.Tensor]:
    index = target / "model.safetensors.index.json"
    where = json.loads(index.read_text())["weight_map"] if index.is_file() else {}
    out = []
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        with safe_open(str(target / where.get(name, "model.safetensors")), "pt") as fh:
            out.append(fh.get_tensor(name).float())
    return out[0], out[1]


def test_vllm_reads_the_export_as_validate_does_and_its_cpu_build_refuses_dspark(vllm: Path, tmp_path: Path) -> None:
    from mtp2draft.engines.vllm_launch import vllm_environment

    config = json.loads((TARGET / "config.json").read_text())
    n = config["num_hidden_layers"]
    fields = DSparkFields(4, (1, n // 2, n - 2), config["vocab_size"] - 1, 8, None, None, "config.json")
    draft = disk.new_dspark_draft(config, fields, 1, *_shared(TARGET))
    (tmp_path / "d").mkdir()
    disk.save_dspark(draft, tmp_path / "d", {"name_or_path": "elsewhere", "architectures": ["X"]})
    out = tmp_path / "export"
    export(tmp_path / "d", "speculators-dspark", out, target=str(TARGET), config=ExportConfig(dtype="float32"))
    assert validate(out) == []
    run = subprocess.run([str(vllm), str(DRIVER), str(out), str(tmp_path)], env=vllm_environment(1),
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads((tmp_path / "reply.json").read_text())
    ours, spec = vllm_view(json.loads((out / "config.json").read_text()))
    assert got["speculative_config"] == spec == {"method": "dspark", "num_speculative_tokens": fields.block_size}
    for key in ("architectures", "target_layer_ids", "eagle_aux_hidden_state_layer_ids", "sample_from_anchor",
                "dspark_bonus_anchor", "mask_token_id", "markov_rank", "block_size", "hidden_size", "vocab_size"):  # fmt: skip
        assert got["pre_trained_config"][key] == ours[key], key
    assert got["pre_trained_config"]["target_layer_ids"] == list(fields.target_layer_ids)
    assert got["pre_trained_config"]["architectures"] == ["Qwen3DSparkModel"]
    # the CPU build: no Triton, so the V1 runner, which refuses DSpark
    assert got["has_triton"] is False
    assert got["engine_config_error"] is not None and REFUSAL in got["engine_config_error"], got["engine_config_error"]
    # the module tree vLLM builds from that config, loaded by its own load_weights
    assert (got["speculative_method"], got["num_speculative_tokens"]) == ("dspark", fields.block_size)
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "loaded.safetensors"))
    fused = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
             "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}  # fmt: skip
    used = set()
    for name, value in theirs.items():
        stem = name.removeprefix("model.").removesuffix(".weight")
        parts = next(([stem.replace(f, p) for p in ps] for f, ps in fused.items() if stem.endswith(f)), None)
        keys = [f"{p}.weight" for p in parts] if parts else [name.removeprefix("model.")]
        if all(k in ours for k in keys):
            assert torch.equal(value, torch.cat([ours[k] for k in keys])), name
            used |= set(keys)
    assert used == set(ours)  # every exported tensor landed in vLLM's module with its value
    unfilled = {n for n in got["parameters"] if n.removeprefix("model.") not in used and
                not any(n.endswith(f"{f}.weight") for f in fused)}  # fmt: skip
    assert unfilled == {"model.mask_embedding", "model.embed_tokens.weight", "lm_head.weight"}
