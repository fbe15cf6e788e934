"""What names a family in a config.json, shared by a supported family's spec (`spec.Spec`) and a family mtp2draft
knowingly does not convert (`not_supported.NotSupported`): its name, description, `architectures` and `model_types`,
and the one rule that matches a config.json against them.

What this module does not do: choose among several matching families (`spec.find_spec` tries every spec's
architectures before any model type, and specs before not-supported rows) or say anything about a family's layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FamilyIdentity:
    name: str
    description: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]

    def by_architecture(self, config: Mapping[str, Any]) -> bool:
        """config.json names one of this family's `architectures`."""
        return bool(set(config.get("architectures") or []) & set(self.architectures))

    def by_model_type(self, config: Mapping[str, Any]) -> bool:
        """config.json's `model_type` is one of this family's."""
        model_type = config.get("model_type")
        return bool(model_type) and model_type in self.model_types

    def matches(self, config: Mapping[str, Any]) -> bool:
        return self.by_architecture(config) or self.by_model_type(config)

    def identity_row(self) -> dict[str, Any]:
        """The identity fields as `specs --json` prints them (lists, not tuples)."""
        return {
            "name": self.name,
            "description": self.description,
            "architectures": list(self.architectures),
            "model_types": list(self.model_types),
        }


def named_in(config: Mapping[str, Any]) -> str:
    """How a config.json names its family, for an error line: its architectures, else its model_type."""
    return ", ".join(config.get("architectures") or []) or config.get("model_type") or "no architectures / model_type"
