"""Helpers every format module shares: reading a JSON file of a draft directory, loading and checking weights for the
validators, the model card's file name, and the `speculators_config` section that every speculators-format config
carries (`eagle3.py`'s `speculators`, `speculators_mtp.py`).

What this module does not do: know any one format (each lives in its own module of this package).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mtp2draft.checkpoint.fp8 import SCALE_SUFFIX
from mtp2draft.errors import DraftError, read_json_file
from mtp2draft.formats import verifier_ok
from mtp2draft.kinds import WEIGHTS_FILE
from mtp2draft.settings import MAX_DRAFT_TOKENS

README_FILE = "README.md"
# Every shard the stitched overlay rewrites or a graft writes carries this in its safetensors metadata: `validate` tells a target the overlay was
# laid over (or the overlay itself) from the target as released, whose shards never carry it.
STITCHED_MARK = {"mtp2draft": "stitched MTP layer"}


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = read_json_file(path, DraftError)
    return data if isinstance(data, dict) else None


def load_weights(path: Path, problems: list[str]) -> dict[str, torch.Tensor] | None:
    from safetensors.torch import load_file

    file = path / WEIGHTS_FILE
    if not file.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
        return None
    try:
        return load_file(str(file))
    except Exception as exc:  # a corrupt file is a violation to report, not a crash
        problems.append(f"{WEIGHTS_FILE} cannot be read: {exc}")
        return None


def nonfinite(name: str, tensor: torch.Tensor) -> str | None:
    """What `validate` reports about one tensor: `tensor_checks.tensor_problem`, the check every reader makes."""
    from mtp2draft.checkpoint.tensor_checks import tensor_problem

    return tensor_problem(name, tensor)


def fp8_problems(name: str, tensor_dtype: str, shape, headers: Mapping[str, Any], block, chunks: int = 1) -> list[str]:
    """An FP8 weight needs its `_scale_inv` sibling of shape [ceil(M/bm), ceil(N/bn)], or for a weight pre-sharded in
    `chunks` row chunks [chunks * ceil(M/chunks/bm), ceil(N/bn)] (`checkpoint/fp8.py`)."""
    if tensor_dtype not in ("F8_E4M3", "F8_E5M2"):
        return []
    scale = headers.get(name + SCALE_SUFFIX)
    if scale is None:
        return [f"{name} is FP8 but {name + SCALE_SUFFIX} is missing"]
    want = [math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])] if len(shape) == 2 else None
    if want is not None and chunks > 1 and shape[0] % chunks == 0:
        tiled = [chunks * math.ceil(shape[0] // chunks / block[0]), want[1]]
        want = tiled if list(scale[1]) == tiled else want
    if want is None or list(scale[1]) != want:
        return [f"{name + SCALE_SUFFIX} has shape {list(scale[1])}, expected {want} for a {list(shape)} weight"]
    return []


def read_headers(file: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) from a file's header, read and validated by safetensors (no tensor bytes)."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return {k: (f.get_slice(k).get_dtype(), list(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118


def finite_file(file: Path, names: list[str]) -> list[str]:
    from safetensors import safe_open

    problems = []
    with safe_open(str(file), framework="pt") as fh:
        for name in names:
            if (msg := nonfinite(name, fh.get_tensor(name))) is not None:
                problems.append(msg)
    return problems


def required_value_problems(cfg: Mapping[str, Any], required: Mapping[str, Any], reader: str = "") -> list[str]:
    """The values a format's config.json must hold, {key: value} (the format's data: the class its engine builds the
    draft with, the type it dispatches on): one problem per key that differs. reader: who needs them ("SGLang")."""
    need = f"{reader} needs" if reader else "expected"
    return [f"{key} is {cfg.get(key)!r}, {need} {value!r}" for key, value in required.items() if cfg.get(key) != value]


def section(cfg: Mapping[str, Any], key: str, why: str, problems: list[str]) -> dict[str, Any] | None:
    """cfg[key] when it is a JSON object; else None, with the problem recorded."""
    value = cfg.get(key)
    if isinstance(value, dict):
        return value
    problems.append(f"{key} is missing{why}")
    return None


def speculators_section_problems(cfg: Mapping[str, Any], algorithm: str) -> list[str]:
    """What is wrong with the `speculators_config` of a speculators-format config.json (every speculator type has
    one: speculators' `SpeculatorsConfig`, which vLLM reads k and the verifier from)."""
    problems: list[str] = []
    sc = section(cfg, "speculators_config", "", problems)
    if sc is None:
        return problems
    if sc.get("algorithm") != algorithm:
        problems.append(f"speculators_config.algorithm is {sc.get('algorithm')!r}, expected {algorithm!r}")
    methods = sc.get("proposal_methods")
    if not isinstance(methods, list) or not methods:
        problems.append("speculators_config.proposal_methods is missing or empty (vLLM reads k from the first)")
    else:
        for i, m in enumerate(methods):
            k = m.get("speculative_tokens") if isinstance(m, dict) else None
            if not isinstance(m, dict) or not m.get("proposal_type"):
                problems.append(f"speculators_config.proposal_methods[{i}] has no proposal_type")
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
                problems.append(
                    f"speculators_config.proposal_methods[{i}].speculative_tokens must be in [1, {MAX_DRAFT_TOKENS}]"
                )
        types = [m.get("proposal_type") for m in methods if isinstance(m, dict)]
        if sc.get("default_proposal_method") not in types:
            problems.append(
                f"speculators_config.default_proposal_method {sc.get('default_proposal_method')!r} is not one of "
                f"the proposal methods {types}"
            )
    verifier = sc.get("verifier")
    if not isinstance(verifier, dict) or "name_or_path" not in verifier or "architectures" not in verifier:
        problems.append("speculators_config.verifier needs name_or_path and architectures")
    elif verifier["name_or_path"] is not None and not verifier_ok(verifier["name_or_path"]):
        problems.append(
            f"speculators_config.verifier.name_or_path {verifier['name_or_path']!r} is not one line naming a model"
        )
    return problems


def speculators_proposal(speculative_tokens: int) -> dict[str, Any]:
    """speculators' greedy proposal method (`proposals/greedy.py`: `GreedyTokenProposalConfig`) for k tokens."""
    return {
        "proposal_type": "greedy",
        "speculative_tokens": int(speculative_tokens),
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }


def sglang_steps(k: int) -> str:
    """SGLang's speculative flags for k draft tokens: it counts the root token, so k + 1 draft tokens are vLLM's k
    speculative tokens."""
    return f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"


def quantised_problems(
    file: Path, headers: Mapping[str, Any], cfg: Mapping[str, Any], expected: Mapping[str, Any]
) -> tuple[list[str], set[str]]:
    """(problems, names checked) for the weights of `file` that `cfg`'s quantization_config stores in parts
    (DeepSeek-V4's `.scale`, NVFP4, ...): each part present, the weight's logical shape the config's, and its parts
    dequantised by the scheme's rule (a tampered scale is caught there) to finite values. `expected`: logical key ->
    shape. The other tensors are left to the caller."""
    from safetensors import safe_open

    from mtp2draft.checkpoint.quant import QuantView, quant_method
    from mtp2draft.errors import CheckpointError

    try:
        method = quant_method(cfg)
    except CheckpointError as exc:
        return [str(exc)], set()
    view = QuantView(method, headers)
    problems: list[str] = []
    handled: set[str] = set()
    with safe_open(str(file), framework="pt") as fh:
        for key in sorted(set(view.weights) & set(expected)):
            weight = view.weights[key]
            handled |= set(weight.names.values())
            try:
                scheme = weight.scheme(headers[weight.data][0])
                params = {**method.params_for(key), "scale_key": weight.names.get("scale")}
                shape = scheme.shape({r: tuple(headers[n][1]) for r, n in weight.names.items()}, params)
                if list(shape) != list(expected[key]):
                    problems.append(f"{key} holds a {list(shape)} weight, the config implies {list(expected[key])}")
                    continue
                value = scheme.dequant({r: fh.get_tensor(n) for r, n in weight.names.items()}, params, key)
            except CheckpointError as exc:
                problems.append(str(exc))
                continue
            if (msg := nonfinite(key, value)) is not None:
                problems.append(f"{msg} (dequantised from {' / '.join(weight.names.values())})")
    return problems, handled
