"""What the family tests read back from a fixture checkpoint: its config.json, its index's weight map, every
tensor in fp32, and the RMSNorm their hand-written references apply (shared by tests/test_family_*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (bf16) fixture checkpoint by its hub name, in fp32."""
    out = {}
    for file in sorted(path.glob("model-0*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(file)).items()})
    return out


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
