"""Stage 3, evaluation: real speculative decoding against the target (`decode`: chain drafting, acceptance per
position, the lossless check, `evaluate`), the acceptance rule at a temperature with its distribution check
(`sampling`), its settings (`settings`), a draft against a baseline (`compare`), the lossless verdict in words
(`verdict`) and the charts (`charts`). `evaluate --engine vllm` lives in `engines.vllm_evaluate`.
docs/architecture.md has one line per module."""
