"""Stage 3, evaluation: real speculative decoding against the target (`decode`: chain drafting, acceptance per
position, the lossless check, `evaluate`) and the acceptance rule at a temperature with its distribution check
(`sampling`)."""
