"""The trainable parameter subsets `distill --train-subset` offers, torch-free so that the CLI can list them.

What this module does not do: freeze parameters (`parallel.freeze_subset`) or size memory (`memory.py`).
"""

from __future__ import annotations

# Trainable subsets: name -> (what it trains, fnmatch patterns of parameter names kept FROZEN). Parameter names are
# transformers' (the MTP block is built from its classes): routed experts are `<block>.mlp.experts.*` in every MoE
# family it ships (fused 3-D tensors since transformers 5), shared experts `mlp.shared_expert(s)`.
TRAIN_SUBSETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "all": ("every draft parameter", ()),
    "no-routed-experts": (
        "everything but the routed experts (attention, shared experts, router, norms, projection)",
        ("*.mlp.experts.*",),
    ),
    "attention-only": ("the attention, norms and input projection; the whole MLP frozen", ("*.mlp.*",)),
}
