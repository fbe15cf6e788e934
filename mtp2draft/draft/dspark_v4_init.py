"""A DeepSeek-V4 DSpark drafter for a target that ships a V4 MTP layer and no DSpark drafter: `init_dspark_v4_from_mtp`
starts its stages from the MTP layer (init "mtp") or from seeded random weights (init "random"), so the two can be
trained alike and compared.

From the MTP layer (`hyper.HyperMtpDraft`), init "mtp" copies:

| DSpark tensor | from | why |
|---|---|---|
| every stage's block (attention, MoE, hc mixers, norms) | the MTP block, the same tensors in each stage | the only trained V4 block the target ships past its trunk |
| the last stage's hc_head, norm | the MTP layer's hc_head, norm | the same role: streams -> one hidden -> the target's head |
| main_proj [H, n*H] | h_proj * diag(hnorm) / n, tiled over the n target layers | see below |
| main_norm | ones | it follows main_proj; hnorm's weight is folded into main_proj |

main_proj: the MTP layer reads a target state h as h_proj(hnorm(h)); the stages read the context main_norm(main_proj(
cat(h_1..h_n))). With main_proj = [W, ..., W] / n, W = h_proj * diag(hnorm weight), main_proj(cat) = W mean_i(h_i),
and because RMSNorm divides by a per-token scalar that main_norm's own division removes, main_x is exactly
rms-normalised h_proj(hnorm(mean_i h_i)) (up to the norms' eps): the context starts as the MTP layer's projection of
the pooled target layers, in the input space its block's kv projection was trained on. A fresh main_proj would throw
away the one trained map from target states into that space.

No counterpart, not copied: e_proj and enorm (the stages take the raw embedding on every stream), and hnorm as a
norm of its own (folded into main_proj). Both inits start the Markov head with markov_w2 = 0 (the bias is 0, so the
drafter's first logits are its stages' alone; markov_w1 random, so w2 gets gradient at once) and the confidence head at
0 (a logit of 0: acceptance 0.5). Random init follows transformers' DeepSeek-V4 `_init_weights`: normal(0,
initializer_range) weights, norms 1, sinks 0, hc mixer base 0 and scale 1, router bias 0.

What this module does not do: train (`train/`), or choose the DSpark fields (the caller's: block size, target layers,
noise token, Markov rank).
"""

from __future__ import annotations

import torch

from mtp2draft.draft.dspark_v4 import DSparkV4Draft
from mtp2draft.draft.dspark_v4_io import with_dspark_keys
from mtp2draft.draft.hyper import HyperMtpDraft
from mtp2draft.errors import DraftError
from mtp2draft.family.dspark import DSparkFields

INITS = ("mtp", "random")
# parameter-name endings -> constant starts (transformers 5.24 DeepseekV4PreTrainedModel._init_weights): the rest is
# normal(0, initializer_range)
_ONES = ("norm.weight", "layernorm.weight", ".scale", "hc_scale")
_ZEROS = ("sinks", ".base", "hc_base", "e_score_correction_bias")


def _random_init(draft: DSparkV4Draft, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, tensor in draft.state_dict(keep_vars=True).items():
            if name.endswith(_ONES):
                tensor.fill_(1.0)
            elif name.endswith(_ZEROS):
                tensor.zero_()
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


def init_dspark_v4_from_mtp(
    mtp: HyperMtpDraft, fields: DSparkFields, *, num_stages: int = 3, init: str = "mtp", seed: int = 0
) -> DSparkV4Draft:
    """A `num_stages`-stage DSpark drafter for `mtp`'s target (see the module docstring), in float32, the target's
    embedding and head attached when `mtp` has them. init "mtp": the stages start from the MTP layer; "random":
    from seeded random weights. The Markov and confidence heads start the same way in both (seeded by `seed`)."""
    if init not in INITS:
        raise DraftError(f"init must be one of {', '.join(INITS)}, not {init!r}")
    config = with_dspark_keys(mtp.target_config, fields)
    draft = DSparkV4Draft(config, fields, num_stages, spec=mtp.spec)
    gen = torch.Generator().manual_seed(seed)
    std = float(getattr(draft.config, "initializer_range", 0.02))
    _random_init(draft, std, gen)
    with torch.no_grad():
        if init == "mtp":
            block = {k: v.float() for k, v in mtp.block.state_dict().items()}
            for layer in draft.layers:
                layer.load_state_dict(block)
            draft.hc_head.load_state_dict({k: v.float() for k, v in mtp.hc_head.state_dict().items()})
            draft.norm.weight.copy_(mtp.final_norm.weight)
            n = len(fields.target_layer_ids)
            folded = mtp.h_proj.weight.float() * mtp.hnorm.weight.float()[None, :] / n  # [H, H]
            draft.main_proj.weight.copy_(folded.repeat(1, n))
            draft.main_norm.weight.fill_(1.0)
        draft.markov_head.markov_w2.weight.zero_()
        draft.confidence_head.weight.zero_()
    if mtp.embed_weight is not None and mtp.head_weight is not None:
        draft.attach_target(mtp.embed_weight, mtp.head_weight)
    return draft
