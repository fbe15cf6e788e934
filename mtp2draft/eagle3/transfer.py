"""Initialise the EAGLE-3 layer from an MTP layer: what the transforms read and write (`Eagle3Build`), the fold of
the MTP input projection into attention (`absorb_projection`), the MLP, norm and lm_head transfers. The attention
transfers are in `eagle3/attention.py`; the registry that specs name them by is `transforms.EAGLE3_TRANSFORMS`.

How the EAGLE-3 initialisation maps the MTP computation (H hidden, u = x / rms(x)):
    MTP:    x = P_e enorm(e) + P_h hnorm(h_final);  q = Wq input_layernorm(x) = Wq_u u,  residual = x
    EAGLE3: q = Wq3 [input_layernorm(e); hidden_norm(h')],  residual = h' = fc([low; mid; high])
With both EAGLE-3 input norms set to ones, `Wq3 = [Wq_u P_e D_e / c, Wq_u c_h / c]` and
`fc_high = P_h D_h / rho` reproduce the MTP attention input up to two approximations: rms(x) is replaced by a
constant c, and h' = P_h hnorm(h_high) uses the highest captured target layer instead of the final one.
c, c_h and rho are estimated from weights here and refined from real activations by `calibrate_eagle3`.
Every other transfer is exact where the block kinds agree (norms, dense MLP, lm_head) and an approximation where
they do not (MLA's low-rank norms, partial RoPE, QK-norm, attention gates, MoE routing, biases).

Each transform records, per output tensor, whether the transfer is exact or an approximation (and why), which the
provenance file carries. What this module does not do: read checkpoints or write files; it works on tensors handed to
it through `Eagle3Build`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mtp2draft.checkpoint.tensors import check_finite
from mtp2draft.errors import CheckpointError


@dataclass
class Eagle3Build:
    """What EAGLE-3 transforms read and write.

    `tensor(name)` returns an MTP tensor in fp32 by its name in the native module ("eh_proj.weight",
    "block.self_attn.o_proj.weight", ...). `expert(e)` returns (gate [I, H], up [I, H], down [H, I]) of routed expert
    e without reading the others. `target_head()` is the target's lm_head [V, H], already in `dtype` (it is copied,
    never computed on). `shapes` maps the native module's tensor names to their shapes (the layer's layout, e.g. the
    routed experts' count and width), without reading.

    `dtype` is the dtype of the finished layer: `put` checks a tensor finite and casts it at once, so the outputs
    accumulate in `dtype` while each transform computes in fp32. A transform that still changes an output after
    `put` may only copy (concatenate, repeat): those commute with the cast, so the bytes equal a cast at the end.
    """

    spec: Any
    block_config: Any
    target_text_config: dict[str, Any]
    tensor: Callable[[str], torch.Tensor]
    has: Callable[[str], bool]
    expert: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    target_head: Callable[[], torch.Tensor]
    aux_layer_ids: list[int]
    out: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtype: torch.dtype = torch.float32

    @property
    def hidden_size(self) -> int:
        return int(self.block_config.hidden_size)

    def norm_weight(self, name: str) -> torch.Tensor:
        """A norm's weight in standard form (x * w): zero-centred norms (x * (1 + w)) fold exactly to 1 + w."""
        w = self.tensor(name)
        return w + 1.0 if self.spec.layer.norm == "zero_centered" else w

    def piece(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A piece of output `name` that is only concatenated from here on, checked finite and cast to `dtype` now,
        so its fp32 copy need not be kept."""
        return check_finite(name, tensor).to(self.dtype)

    def put(self, name: str, tensor: torch.Tensor, exact: bool, sources: list[str], how: str) -> None:
        self.out[name] = check_finite(name, tensor).to(self.dtype).contiguous()
        self.provenance[name] = {"exact": exact, "from": sources, "how": how}


def fro_rms(w: torch.Tensor, dim_in_scale: torch.Tensor | None = None) -> float:
    """RMS of W @ (D u) over the rows of W, for u isotropic with unit variance: ||W D||_F / sqrt(rows)."""
    m = w if dim_in_scale is None else w * dim_in_scale
    return float(m.norm() / math.sqrt(w.shape[0]))


def absorb_projection(b: Eagle3Build) -> None:
    """Fold enorm/hnorm/eh_proj into the 2H-wide q/k/v and initialise fc (see the module docstring)."""
    att = b.scratch.pop("attention", None)  # its fp32 q/k/v are folded into the outputs here, then dropped
    if att is None:
        raise CheckpointError("absorb_projection needs an attention transform before it in the spec")
    h = b.hidden_size
    proj = b.tensor("eh_proj.weight")  # [H, 2H]
    first, second = proj[:, :h], proj[:, h:]
    p_e, p_h = (first, second) if b.spec.layer.concat == "embed_hidden" else (second, first)
    d_e, d_h = b.norm_weight("enorm.weight"), b.norm_weight("hnorm.weight")
    pe, ph = p_e * d_e, p_h * d_h  # act on e / rms(e) and h / rms(h)
    c_e, c_h = float(pe.norm() / math.sqrt(h)), float(ph.norm() / math.sqrt(h))
    c = math.sqrt(c_e**2 + c_h**2)
    sources = ["enorm.weight", "hnorm.weight", "eh_proj.weight", *att["from"]]
    how = f"eh_proj and enorm/hnorm absorbed, rms(x) ~ {c:.4g} (weight estimate); " + att["how"]
    for p in "qkv":
        w = att[p]  # [out, H] on u
        b.put(f"midlayer.self_attn.{p}_proj.weight", torch.cat([w @ pe / c, w * (c_h / c)], dim=1), False, sources, how)
    ones = torch.ones(h)
    b.put("midlayer.input_layernorm.weight", ones, False, ["enorm.weight"], "ones: enorm folded into q/k/v")
    b.put("midlayer.hidden_norm.weight", ones, False, ["hnorm.weight"], "ones: hnorm folded into q/k/v")
    ht = int(b.target_text_config["hidden_size"])
    fc = torch.zeros(h, 3 * ht)
    fc[:, 2 * ht :] = ph  # h' = P_h hnorm(h_high) once scaled by 1 / rms(h_high) (calibrate_eagle3)
    b.put(
        "fc.weight",
        fc,
        False,
        ["eh_proj.weight", "hnorm.weight"],
        "high slot = P_h diag(hnorm) (rms scale refined by calibration); low/mid slots zero",
    )
    extra = _embedding_passthrough_heads(b, pe)
    b.config["mtp2draft_init"] = {
        "c": c,
        "c_e": c_e,
        "c_h": c_h,
        "fc_scale_calibrated": False,
        "passthrough_heads": extra,
        "mtp_heads": int(b.config["num_attention_heads"]) - extra,
    }


def _embedding_passthrough_heads(b: Eagle3Build, pe: torch.Tensor, sharpness: float = 16.0) -> int:
    """Append attention heads that carry P_e enorm(e) of each entry's own token into the residual.

    In the MTP layer the embedding term P_e enorm(e) is part of the block input, so it reaches the residual stream
    directly; EAGLE-3's residual is fc's output alone and the token embedding only enters through attention. These
    heads restore that path: each attends (almost) only to its own entry — q = a R e_n and k = R e_n with R an
    orthonormal d x H projection and e_n = e / rms(e), so the score peaks at the entry itself (or at entries of the
    same token, which carry the same value) — and its value is a d-row slice of P_e diag(enorm) e_n, written back by
    o_proj to the same rows of the residual.

    A kv head carries d values, so ceil(H / d) heads are needed; grouped k/v (GQA) are first expanded to one kv head
    per q head (exact), and the total head count is rounded up to divide H (transformers' LlamaConfig requires it,
    and so do engines that read the config through it) and to keep the power-of-two factor tensor parallelism
    needs; heads beyond the needed ones stay zero. Returns the number of q heads added.
    """
    h = b.hidden_size
    heads, kv = int(b.config["num_attention_heads"]), int(b.config["num_key_value_heads"])
    d, g = int(b.config["head_dim"]), heads // kv
    if g > 1:  # GQA -> one kv head per q head: repeat each kv head's rows for the q heads it serves (exact)
        for p in "kv":
            key = f"midlayer.self_attn.{p}_proj.weight"
            b.out[key] = b.out[key].view(kv, d, -1).repeat_interleave(g, dim=0).reshape(heads * d, -1)
            b.provenance[key]["how"] += f"; grouped k/v repeated to {heads} kv heads (exact)"
    needed = math.ceil(h / d)
    tp = min(16, heads & -heads)  # largest power of two dividing the head count (at most 16)
    total = next((t for t in range(heads + needed, h + 1) if h % t == 0 and t % tp == 0), None)
    if total is None:
        total = next(t for t in range(heads + needed, 8 * (heads + needed)) if t % tp == 0)
    extra = total - heads
    gen = torch.Generator().manual_seed(0)
    r = torch.linalg.qr(torch.randn(h, d, generator=gen))[0].T if d <= h else torch.eye(d, h)  # [d, H] orthonormal
    alpha = sharpness / math.sqrt(d)  # self score ~ alpha * |R e_n|^2 / sqrt(d) ~ sharpness
    # built in the outputs' dtype: filling a tensor rounds each value as casting it afterwards would
    dt = b.out["midlayer.self_attn.o_proj.weight"].dtype
    q_new, k_new, v_new = (torch.zeros(extra * d, 2 * h, dtype=dt) for _ in "qkv")
    o_new = torch.zeros(h, extra * d, dtype=dt)
    for j in range(min(needed, extra)):
        rows = slice(j * d, min((j + 1) * d, h))
        n = rows.stop - rows.start
        k_new[j * d : (j + 1) * d, :h] = r
        q_new[j * d : (j + 1) * d, :h] = alpha * r
        v_new[j * d : j * d + n, :h] = pe[rows]  # on input_layernorm(e) = e / rms(e) (weight ones)
        o_new[rows, j * d : j * d + n] = torch.eye(n)
    how = (
        f"+{extra} embedding pass-through heads ({min(needed, extra)} used; attend to their own entry, value = "
        "P_e diag(enorm) e / rms(e)): carry the MTP input's embedding term into the residual"
    )
    for p, new in (("q", q_new), ("k", k_new), ("v", v_new)):
        key = f"midlayer.self_attn.{p}_proj.weight"
        b.out[key] = torch.cat([b.out[key], new], dim=0)
        b.provenance[key]["how"] += "; " + how
    key = "midlayer.self_attn.o_proj.weight"
    b.out[key] = torch.cat([b.out[key], o_new], dim=1)
    b.provenance[key] = {**b.provenance[key], "exact": False, "how": b.provenance[key]["how"] + "; " + how}
    b.config["num_attention_heads"] = b.config["num_key_value_heads"] = total
    return extra


def mlp_dense(b: Eagle3Build) -> None:
    """Dense SwiGLU -> Llama MLP (exact)."""
    for p in ("gate", "up", "down"):
        src = f"block.mlp.{p}_proj.weight"
        b.put(f"midlayer.mlp.{p}_proj.weight", b.tensor(src), True, [src], "copied")
    b.config["intermediate_size"] = int(b.out["midlayer.mlp.gate_proj.weight"].shape[0])


def _routing_estimate(b: Eagle3Build, n_experts: int, samples: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """Selection frequency and mean weight-when-selected per routed expert, from the family's own router module run
    on random inputs shaped like its real input (unit-rms vectors scaled by post_attention_layernorm)."""
    from mtp2draft.draft.modules import ComposedBlock

    spec = b.spec
    with torch.device("meta"):
        block = (
            spec.block_class()(b.block_config, 0) if spec.block.decoder_layer else ComposedBlock(spec, b.block_config)
        )
    router = block.mlp.gate
    router.to_empty(device="cpu")
    state = {}
    for name, buf in list(router.state_dict().items()):
        key = f"block.mlp.gate.{name}"
        state[name] = b.tensor(key) if b.has(key) else torch.zeros_like(buf)
    router.load_state_dict(state)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, b.hidden_size, generator=gen) * b.norm_weight("block.post_attention_layernorm.weight")
    # Hy3 keeps the selection bias on the MoE block (mlp.e_score_correction_bias) and hands it to the router's forward
    extra = ()
    if "e_score_correction_bias" in inspect.signature(router.forward).parameters:
        key = "block.mlp.e_score_correction_bias"
        extra = (b.tensor(key).float() if b.has(key) else torch.zeros(n_experts),)
    with torch.no_grad():
        out = router(x, *extra)
    weights, index = out[1], out[2]
    if weights.shape != index.shape:  # routers returning dense [tokens, E] scores
        weights = weights.gather(1, index)
    freq = torch.zeros(n_experts).index_add_(0, index.flatten(), torch.ones(index.numel()))
    total = torch.zeros(n_experts).index_add_(0, index.flatten(), weights.flatten().float())
    return freq / samples, total / freq.clamp(min=1)


GATE, UP, DOWN = (f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))


def mlp_moe_to_dense(b: Eagle3Build) -> None:
    """MoE -> one dense SwiGLU: the shared expert(s) plus the routed experts most often selected, each down_proj
    scaled by its mean routing weight, within the target's dense intermediate size (approximate: routing is input
    dependent, the dense MLP is not)."""
    n_experts, two_i, _ = b.shapes["block.mlp.experts.gate_up_proj"]  # [E, 2I, H]: the layout, not config names
    expert_size = two_i // 2
    top_k = int(b.block_config.num_experts_per_tok)
    freq, mean_w = _routing_estimate(b, n_experts)
    gates, ups, downs, sources = [], [], [], []
    for prefix in ("block.mlp.shared_experts.", "block.mlp.shared_expert."):
        if b.has(prefix + "gate_proj.weight"):
            scale = 1.0
            if b.has("block.mlp.shared_expert_gate.weight"):
                scale = 0.5  # sigmoid(shared_expert_gate(x)) ~ sigmoid(0)
            gates.append(b.piece(GATE, b.tensor(prefix + "gate_proj.weight")))
            ups.append(b.piece(UP, b.tensor(prefix + "up_proj.weight")))
            downs.append(b.piece(DOWN, b.tensor(prefix + "down_proj.weight") * scale))
            sources.append(prefix + "*")
    shared = sum(g.shape[0] for g in gates)
    budget = int(b.target_text_config.get("intermediate_size") or (shared + top_k * expert_size))
    m = min(n_experts, max(top_k, (budget - shared) // expert_size))
    chosen = torch.argsort(freq, descending=True, stable=True)[:m].tolist()
    for e in sorted(chosen):
        g, u, dn = b.expert(e)
        gates.append(b.piece(GATE, g))
        ups.append(b.piece(UP, u))
        downs.append(b.piece(DOWN, dn * float(mean_w[e])))
        del g, u, dn  # one expert in fp32 at a time
    sources.append(f"block.mlp.experts[{','.join(map(str, sorted(chosen)))}]")
    how = (
        f"shared expert(s) + {m}/{n_experts} routed experts most selected under random unit-rms inputs, "
        "down_proj scaled by mean routing weight"
    )
    for name, parts, dim in ((GATE, gates, 0), (UP, ups, 0), (DOWN, downs, 1)):
        b.put(name, torch.cat(parts, dim=dim), False, sources, how)
        parts.clear()
    b.config["intermediate_size"] = int(b.out["midlayer.mlp.gate_proj.weight"].shape[0])


def norms(b: Eagle3Build) -> None:
    """post_attention_layernorm and the final norm carry over (exact; zero-centred weights folded to 1 + w)."""
    how = "copied" + (" (1 + w folded)" if b.spec.layer.norm == "zero_centered" else "")
    src = "block.post_attention_layernorm.weight"
    b.put("midlayer.post_attention_layernorm.weight", b.norm_weight(src), True, [src], how)
    b.put("norm.weight", b.norm_weight("final_norm.weight"), True, ["final_norm.weight"], how)
    b.config["rms_norm_eps"] = float(b.block_config.rms_norm_eps)


def lm_head_from_target(b: Eagle3Build) -> None:
    """The draft's lm_head starts as the target's head over the full vocabulary (exact); distill narrows it."""
    head = b.target_head()
    b.put("lm_head.weight", head, True, ["target lm_head"], "copied (full vocabulary; d2t = 0, t2d = all)")
    b.config["draft_vocab_size"] = int(head.shape[0])
