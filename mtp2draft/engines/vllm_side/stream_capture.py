"""Have vLLM's hidden-state extraction return a multi-stream target's residual streams; runs under vLLM's Python.

What a DeepSeek-V4 MTP layer consumes is the target's last-layer residual, `hc_mult` streams [T, hc_mult, H] after the
last decoder layer's `mhc_post` and before `hc_head` (the spec's `hidden = "pre_norm"`). vLLM 0.34's
`DeepseekV4Model.forward` (models/deepseek_v4/nvidia/model.py; cpu/model.py is the same in this respect) hands
extraction, for each layer id asked, `mhc_post(...).mean(dim=1)`: the MEAN of the streams, [T, H], which is not
that. The streams themselves are the tensor the same forward copies into `self._mtp_hidden_buffer`
([max_num_batched_tokens, hc_mult * H], what `get_mtp_target_hidden_states` hands vLLM's own MTP draft), and
extraction stores [T, len(layer ids), hidden_size] (v1/worker/gpu/spec_decode/extract_hidden_states.py stacks the
aux states on dim 1). So with `MTP2DRAFT_VLLM_STREAMS=<hc_mult>` mtp2draft's side asks for `hc_mult` layer ids, and
the forward here (a) makes sure the buffer exists and is large enough, (b) runs vLLM's forward, (c) returns as the
aux states the buffer's rows split into the streams, stream s in slot s, [T, H] each.

The drivers call `apply()` at import, so vLLM's spawned workers (which re-import the driver) get it too; it is
reported in the driver's reply. What it does not do: change vLLM's files, or anything when the variable is unset.
"""

from __future__ import annotations

import importlib
import os

STREAMS = "MTP2DRAFT_VLLM_STREAMS"
# The modules defining DeepseekV4Model, per build (vLLM 0.34: nvidia/ on GPU, cpu/ on the CPU build)
MODULES = ("vllm.models.deepseek_v4.nvidia.model", "vllm.models.deepseek_v4.cpu.model")


def _capturing(original):
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        import torch

        n, width = positions.shape[0], self.hc_mult * self.config.hidden_size
        buffer = getattr(self, "_mtp_hidden_buffer", None)
        if buffer is None or buffer.shape[0] < n:  # fp32: the copy into it loses nothing
            self._mtp_hidden_buffer = torch.empty((n, width), dtype=torch.float32, device=positions.device)
        out = original(self, input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        if not isinstance(out, tuple):
            return out
        hidden, aux = out
        streams = self._mtp_hidden_buffer[:n].view(n, self.hc_mult, -1).to(hidden.dtype)  # [T, hc_mult, H]
        if len(aux) != self.hc_mult:
            raise RuntimeError(f"stream capture: {len(aux)} extraction slots for {self.hc_mult} residual streams")
        return hidden, [streams[:, s].contiguous() for s in range(self.hc_mult)]

    return forward


def apply() -> list[str]:
    """Patch DeepseekV4Model.forward when the environment asks for the streams; the names of what was applied."""
    if not os.environ.get(STREAMS):
        return []
    applied = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        cls = module.DeepseekV4Model
        if not getattr(cls.forward, "_mtp2draft_streams", False):
            cls.forward = _capturing(cls.forward)
            cls.forward._mtp2draft_streams = True
        applied.append(f"{name}.DeepseekV4Model: extraction returns the pre-hc_head residual streams, one per slot")
    return applied
