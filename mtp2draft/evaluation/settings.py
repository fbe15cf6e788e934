"""`evaluate`'s decoding settings, declared once: what it decodes and how, whichever engine runs the target.

`EvaluateConfig` is frozen and checks itself on construction (one line naming the option), so a bad value is refused
before any weight loads; each field is declared once (`settings.setting`) and the CLI's `evaluate` and `run` build
their options from them; the demo builds it with keywords, and both engines (`decode.evaluate`,
`engine.evaluate_in_vllm`) take it whole.

What this module does not do: say where the target runs (device, dtype, tensor parallelism: `settings.Placement`,
which both engines take beside it) or decode anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtp2draft.errors import OptionError
from mtp2draft.settings import MAX_DRAFT_TOKENS, check_seed, setting

# The longest generation per prompt the reference loop runs (longer than any bundled target's context).
MAX_NEW_TOKENS = 65536


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig:
    num_draft_tokens: int = setting(4, "Draft tokens verified per target forward (k).", short="-k")
    max_new_tokens: int = setting(64, "Tokens generated per prompt.")
    max_prompts: int | None = setting(None, "Use the first N prompts of the data file (default: all).")
    max_prompt_length: int = setting(256, "Keep the last N tokens of each prompt.")
    temperature: float = setting(
        0.0, "Sampling temperature of target and draft (0: greedy verification; above: speculative sampling)."
    )
    top_p: float = setting(1.0, "Nucleus sampling mass (with --temperature).")
    seed: int = setting(0, "Seed of the sampling (prompt n with (seed, n), every draft alike) and the bootstrap.")
    draft_sampling: str = setting(
        "greedy", "How the draft proposes at a temperature (argmax, or from its own distribution):",
        choices="draft_sampling",
    )  # fmt: skip
    skip_bad: bool = setting(False, "Skip malformed data lines (counted) instead of failing.")
    step_layers: str | None = setting(
        None,
        "Chain drafts (convert --all-layers): the layer each step runs, cycle (layer s % n) or first (layer 0 "
        "reused, as vLLM 0.32 runs it) (default: the rule the draft was trained for).",
        advanced=True,
    )
    confidence_threshold: float = setting(
        0.5,
        "DSpark drafts: the second run cuts each block before its first slot whose sigmoid(confidence) is under this "
        "(SGLang's rule; its default 0.0 verifies whole blocks, the first run).",
        advanced=True,
    )

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
        for option, value, most, why in (
            ("--num-draft-tokens", self.num_draft_tokens, MAX_DRAFT_TOKENS, "every draft step costs a draft forward"),
            ("--max-new-tokens", self.max_new_tokens, MAX_NEW_TOKENS, "longer than any bundled target's context"),
        ):
            if value > most:
                raise OptionError(f"{option} must be at most {most} ({why}), got {value}")
        check_seed(self.seed)
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise OptionError(f"--confidence-threshold must lie in [0, 1], got {self.confidence_threshold}")
        Sampling(self.temperature, self.top_p, self.draft_sampling)  # OptionError on a bad value
        from mtp2draft.family.schema import STEP_LAYER_RULES

        if self.step_layers is not None and self.step_layers not in STEP_LAYER_RULES:
            raise OptionError(f"--step-layers must be one of {', '.join(STEP_LAYER_RULES)}, got {self.step_layers!r}")

    @property
    def sampling(self) -> Any:
        """The sampling rule's settings (`sampling.Sampling`)."""
        from mtp2draft.evaluation.sampling import Sampling

        return Sampling(self.temperature, self.top_p, self.draft_sampling)


__all__ = ["EvaluateConfig"]
