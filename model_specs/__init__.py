"""Spec files, one per checkpoint family (HF model_type); read by mtp2draft.family.spec."""
