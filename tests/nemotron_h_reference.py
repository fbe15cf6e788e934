"""vLLM 0.33's Nemotron-H MTP computation (nemotron_h_mtp.py) with transformers' own NemotronHBlock per sublayer,
from a fixture checkpoint's tensors by their hub names: the reference the three Nemotron-H layouts' tests share
(the text release, and the two omni exports that keep it under other prefixes)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from checkpoint_files import rms, tensors

NOT_CONFIG_FIELDS = ("architectures", "model_type", "layers_block_type", "mtp_layers_block_type")


def reference(
    path: Path, text: dict, nxt, hidden, *, lm: str = "", mtp: str = "mtp.", sublayers: tuple[str, str] | None = None
):
    """(logits, normed) of the MTP layer at `mtp` (`layers.0` attention, `layers.1` MoE) on inputs nxt [B, T] and
    hidden [B, T, H]; `text` is the text model's config, `lm` its key prefix (the embedding and lm_head under it).
    `sublayers`: the two blocks' key prefixes, default the MTP layer's own (trunk layers show a check can fail)."""
    from transformers.models.nemotron_h import modeling_nemotron_h as nh

    w = tensors(path)
    eps = text["layer_norm_epsilon"]
    fields = {k: v for k, v in text.items() if k not in NOT_CONFIG_FIELDS}
    fields.update(num_hidden_layers=2, hybrid_override_pattern="*E")
    cfg = transformers.NemotronHConfig(**fields)
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    blocks = [nh.NemotronHBlock(cfg, 0), nh.NemotronHBlock(cfg, 1)]
    m0, m1 = mtp + "layers.0.", mtp + "layers.1."
    for block, prefix in zip(blocks, sublayers or (m0, m1), strict=True):
        state = {}
        for name in block.state_dict():
            if name in ("mixer.experts.up_proj", "mixer.experts.down_proj"):
                which = name.rsplit(".", 1)[1]
                experts = range(text["n_routed_experts"])
                state[name] = torch.stack([w[f"{prefix}mixer.experts.{e}.{which}.weight"] for e in experts])
            else:
                state[name] = w[prefix + name]
        block.load_state_dict(state)
    e = torch.nn.functional.embedding(nxt, w[lm + "backbone.embeddings.weight"])
    x = torch.cat([rms(e, w[m0 + "enorm.weight"], eps), rms(hidden, w[m0 + "hnorm.weight"], eps)], -1)
    x = x @ w[m0 + "eh_proj.weight"].T
    t = x.shape[1]
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    x = blocks[1](blocks[0](x, attention_mask=mask))  # NoPE: no position embeddings at all
    normed = rms(x, w[m1 + "final_layernorm.weight"], eps)
    return normed @ w[lm + "lm_head.weight"].T, normed
