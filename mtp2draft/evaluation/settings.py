"""`evaluate`'s decoding settings, declared once: what it decodes and how, whichever engine runs the target.

`EvaluateConfig` is frozen and checks itself on construction (one line naming the option), so a bad value is refused
before any weight loads; the CLI builds it from its parsed options by field name (`from_options`), `run` and the
demo from their own settings, and both engines (`decode.evaluate`, `engine.evaluate_in_vllm`) take it whole.

What this module does not do: say where the target runs (device, dtype, tensor parallelism: each engine's own
arguments) or decode anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mtp2draft.errors import OptionError


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    num_draft_tokens: int = 4
    """k: draft tokens verified per target forward."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    max_prompts: int | None = None
    """The first N prompts of the data file (None: all)."""
    max_prompt_length: int = 256
    """The last N tokens of each prompt are kept."""
    temperature: float = 0.0
    """0: greedy verification; above it, speculative sampling at that temperature."""
    top_p: float = 1.0
    """Nucleus mass of the sampling (with a temperature)."""
    seed: int = 0
    """Seeds the sampling (prompt n with (seed, n), for every draft alike) and the paired bootstrap."""
    draft_sampling: str = "greedy"
    """How the draft proposes at a temperature: argmax (greedy) or sampling from its own distribution (sample)."""
    skip_bad: bool = False
    """Skip malformed data lines (counted) instead of failing."""
    step_layers: str | None = None
    """Chain drafts (every MTP layer): which layer each draft step runs, `cycle` (layer s % n) or `first` (layer 0
    reused, as vLLM 0.32's runner does); None: the rule recorded in the draft (the one it was trained for)."""

    def __post_init__(self) -> None:
        from mtp2draft.evaluation.sampling import Sampling

        for option, value in (
            ("--num-draft-tokens", self.num_draft_tokens),
            ("--max-new-tokens", self.max_new_tokens),
            ("--max-prompt-length", self.max_prompt_length),
            ("--max-prompts", 1 if self.max_prompts is None else self.max_prompts),
        ):
            if value < 1:
                raise OptionError(f"{option} must be at least 1, got {value}")
        Sampling(self.temperature, self.top_p, self.draft_sampling)  # OptionError on a bad value
        from mtp2draft.family.spec import STEP_LAYER_RULES

        if self.step_layers is not None and self.step_layers not in STEP_LAYER_RULES:
            raise OptionError(f"--step-layers must be one of {', '.join(STEP_LAYER_RULES)}, got {self.step_layers!r}")

    @property
    def sampling(self) -> Any:
        """The sampling rule's settings (`sampling.Sampling`)."""
        from mtp2draft.evaluation.sampling import Sampling

        return Sampling(self.temperature, self.top_p, self.draft_sampling)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> EvaluateConfig:
        """The settings among a command's parsed options, taken by field name."""
        return cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})


__all__ = ["EvaluateConfig"]
