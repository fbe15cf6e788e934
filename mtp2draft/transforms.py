"""Named weight transforms that spec files refer to.

Two registries:
- `LOAD_TRANSFORMS` map a block's checkpoint layout onto the transformers module layout and back (e.g. per-expert
  `experts.{e}.gate_proj.weight` <-> fused 3-D `experts.gate_up_proj`). Each is exact and invertible; the inverse is
  what the `stitched` exporter uses to write a fine-tuned layer back under the original key names.
- `EAGLE3_TRANSFORMS` initialise the EAGLE-3 layer from an MTP layer. Each records, per output tensor, whether the
  transfer is exact or an approximation (and why), which the provenance file carries.

How the EAGLE-3 initialisation maps the MTP computation (H hidden, u = x / rms(x)):
    MTP:    x = P_e enorm(e) + P_h hnorm(h_final);  q = Wq input_layernorm(x) = Wq_u u,  residual = x
    EAGLE3: q = Wq3 [input_layernorm(e); hidden_norm(h')],  residual = h' = fc([low; mid; high])
With both EAGLE-3 input norms set to ones, `Wq3 = [Wq_u P_e D_e / c, Wq_u c_h / c]` and
`fc_high = P_h D_h / rho` reproduce the MTP attention input up to two approximations: rms(x) is replaced by a
constant c, and h' = P_h hnorm(h_high) uses the highest captured target layer instead of the final one.
c, c_h and rho are estimated from weights here and refined from real activations by `calibrate_eagle3`.
Every other transfer is exact where the block kinds agree (norms, dense MLP, lm_head) and an approximation where
they do not (MLA's low-rank norms, partial RoPE, QK-norm, attention gates, MoE routing, biases).

What this module does not do: read checkpoints or write files; it works on tensors handed to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import CheckpointError, SpecError

# ---- load transforms (checkpoint <-> module layout) ---------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One module tensor and the checkpoint tensors (block-relative keys) it is built from, in order."""

    module_key: str
    ckpt_keys: tuple[str, ...]
    transform: str = ""


class FuseExperts:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` <-> transformers' fused `experts.gate_up_proj`
    [E, 2I, H] (gate rows first, then up) and `experts.down_proj` [E, H, I]."""

    name = "fuse_experts"
    pattern = re.compile(r"^(?P<p>(?:.*\.)?)experts\.(?P<e>\d+)\.(?P<w>gate|up|down)_proj\.weight$")

    def group(self, keys: list[str]) -> tuple[list[Group], list[str]]:
        found: dict[tuple[str, str], dict[int, str]] = {}
        rest = []
        for key in keys:
            m = self.pattern.match(key)
            if not m:
                rest.append(key)
                continue
            found.setdefault((m["p"], m["w"]), {})[int(m["e"])] = key
        groups = []
        for prefix in sorted({p for p, _ in found}):
            gate, up, down = (found.get((prefix, w), {}) for w in ("gate", "up", "down"))
            experts = sorted(set(gate) | set(up) | set(down))
            if experts != list(range(len(experts))) or not (set(gate) == set(up) == set(down)):
                raise CheckpointError(f"{prefix}experts: incomplete expert weights (experts {experts[:8]}...)")
            pairs = tuple(k for e in experts for k in (gate[e], up[e]))
            groups.append(Group(f"{prefix}experts.gate_up_proj", pairs, self.name))
            groups.append(Group(f"{prefix}experts.down_proj", tuple(down[e] for e in experts), self.name))
        return groups, rest

    def combine(self, group: Group, tensors: list[torch.Tensor]) -> torch.Tensor:
        if group.module_key.endswith("gate_up_proj"):
            # [E, 2I, H]: expert e = cat(gate_e [I, H], up_e [I, H]) along rows
            return torch.stack([torch.cat(tensors[i : i + 2], dim=0) for i in range(0, len(tensors), 2)])
        return torch.stack(tensors)  # [E, H, I]

    def combine_stream(
        self, group: Group, shape: tuple[int, ...], stream: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
    ) -> torch.Tensor:
        """`combine` filling a preallocated output expert by expert, so memory holds the output plus one expert."""
        out = torch.empty(shape, dtype=dtype)
        slot = {key: i for i, key in enumerate(group.ckpt_keys)}
        fused = group.module_key.endswith("gate_up_proj")
        for key, tensor in stream:
            i = slot[key]
            if fused:  # ckpt keys alternate gate_e, up_e: rows [0, I) and [I, 2I) of expert e
                rows = tensor.shape[0]
                out[i // 2, (i % 2) * rows : (i % 2 + 1) * rows] = tensor
            else:
                out[i] = tensor
        return out

    def out_shape(self, group: Group, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        rows, cols = shapes[0]
        if group.module_key.endswith("gate_up_proj"):
            return (len(shapes) // 2, 2 * rows, cols)
        return (len(shapes), rows, cols)

    def split(self, group: Group, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        if group.module_key.endswith("gate_up_proj"):
            out = {}
            for e in range(tensor.shape[0]):
                gate, up = tensor[e].chunk(2, dim=0)
                out[group.ckpt_keys[2 * e]], out[group.ckpt_keys[2 * e + 1]] = gate, up
            return out
        return {key: tensor[e] for e, key in enumerate(group.ckpt_keys)}

    def expert_keys(self, group: Group, e: int) -> tuple[str, ...]:
        """The checkpoint keys of expert `e` in a group `group()` made: (gate, up) of `gate_up_proj`, (down,) of
        `down_proj`."""
        if group.module_key.endswith("gate_up_proj"):
            return group.ckpt_keys[2 * e : 2 * e + 2]
        return (group.ckpt_keys[e],)

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Module tensor -> per-expert checkpoint tensors (keys relative to the block); None if not ours."""
        for suffix, names in (("experts.gate_up_proj", ("gate", "up")), ("experts.down_proj", ("down",))):
            if module_key.endswith(suffix):
                prefix = module_key[: -len(suffix)]
                keys = tuple(f"{prefix}experts.{e}.{n}_proj.weight" for e in range(tensor.shape[0]) for n in names)
                return self.split(Group(module_key, keys, self.name), tensor)
        return None


class FusedExperts3d(FuseExperts):
    """Checkpoints that store experts already fused, as Qwen3.5-MoE's BF16 release does: `experts.gate_up_proj`
    [E, 2I, H] (gate rows first, then up) and `experts.down_proj` [E, H, I], no `.weight` suffix. That is the
    transformers module layout itself (vLLM and SGLang split gate_up with `chunk(2, dim=-2)`, no transpose), so
    those keys map 1:1. Per-expert keys (some quantised re-releases ship them) are fused as `fuse_experts` does.
    The inverse writes the fused 3-D layout."""

    name = "fused_experts_3d"

    def to_checkpoint(self, module_key: str, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        if module_key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return {module_key: tensor}
        return None


LOAD_TRANSFORMS: dict[str, Any] = {t.name: t for t in (FuseExperts(), FusedExperts3d())}


def group_block_keys(keys: list[str], rename: dict[str, str], load: tuple[str, ...]) -> list[Group]:
    """Block-relative checkpoint keys -> groups keyed by module name (relative to the block)."""
    renamed = {}
    for key in keys:
        new = key
        for old_prefix, new_prefix in rename.items():
            if new.startswith(old_prefix):
                new = new_prefix + new[len(old_prefix) :]
                break
        renamed[new] = key
    groups: list[Group] = []
    rest = list(renamed)
    for name in load:
        made, rest = LOAD_TRANSFORMS[name].group(rest)
        groups += [Group(g.module_key, tuple(renamed[k] for k in g.ckpt_keys), g.transform) for g in made]
    groups += [Group(k, (renamed[k],)) for k in rest]
    return groups


# ---- EAGLE-3 initialisation ----------------------------------------------------------------------------------------


@dataclass
class Eagle3Build:
    """What EAGLE-3 transforms read and write.

    `tensor(name)` returns an MTP tensor in fp32 by its name in the native module ("eh_proj.weight",
    "block.self_attn.o_proj.weight", ...). `expert(e)` returns (gate [I, H], up [I, H], down [H, I]) of routed expert
    e without reading the others. `target_head()` is the target's lm_head [V, H]. `shapes` maps the native module's
    tensor names to their shapes (the layer's layout, e.g. the routed experts' count and width), without reading.
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

    @property
    def hidden_size(self) -> int:
        return int(self.block_config.hidden_size)

    def norm_weight(self, name: str) -> torch.Tensor:
        """A norm's weight in standard form (x * w): zero-centred norms (x * (1 + w)) fold exactly to 1 + w."""
        w = self.tensor(name)
        return w + 1.0 if self.spec.layer.norm == "zero_centered" else w

    def put(self, name: str, tensor: torch.Tensor, exact: bool, sources: list[str], how: str) -> None:
        self.out[name] = tensor.contiguous()
        self.provenance[name] = {"exact": exact, "from": sources, "how": how}


def _fro_rms(w: torch.Tensor, dim_in_scale: torch.Tensor | None = None) -> float:
    """RMS of W @ (D u) over the rows of W, for u isotropic with unit variance: ||W D||_F / sqrt(rows)."""
    m = w if dim_in_scale is None else w * dim_in_scale
    return float(m.norm() / math.sqrt(w.shape[0]))


def rope_permutation(head_dim: int, rope_dim: int, rope_offset: int, interleaved: bool) -> tuple[list[int], int]:
    """Permutation of one head's dims so Llama's full RoPE (pairs (i, i + d/2), freq theta'^(-2i/d)) acts like the
    source's partial RoPE on `rope_dim` dims starting at `rope_offset` (pairs (2j, 2j+1) when interleaved, else
    (j, j + rope_dim/2), freq theta^(-2j/rope_dim)).

    Rope pair j goes to Llama slot j; pass-through dims fill the remaining slots. With theta' = theta^(d/rope_dim)
    slot j has exactly the source frequency, and pass-through slots (j >= rope_dim/2) rotate at theta^(-1) or slower:
    nearly unrotated over draft-length distances. Returns (perm, exponent) with llama_dim[k] = src_dim[perm[k]] and
    theta' = theta ** exponent.
    """
    d, half, rhalf = head_dim, head_dim // 2, rope_dim // 2
    if interleaved:
        pairs = [(rope_offset + 2 * j, rope_offset + 2 * j + 1) for j in range(rhalf)]
    else:
        pairs = [(rope_offset + j, rope_offset + j + rhalf) for j in range(rhalf)]
    rope_dims = {i for p in pairs for i in p}
    passthrough = [i for i in range(d) if i not in rope_dims]
    perm = [0] * d
    for j, (a, b) in enumerate(pairs):
        perm[j], perm[j + half] = a, b
    n_pass_half = len(passthrough) // 2
    for k, src in enumerate(passthrough[:n_pass_half]):
        perm[rhalf + k] = src
    for k, src in enumerate(passthrough[n_pass_half:]):
        perm[half + rhalf + k] = src
    return perm, d / rope_dim


def _permute_heads(w: torch.Tensor, heads: int, perm: list[int]) -> torch.Tensor:
    """Permute the per-head output rows of a projection [heads * d, in]."""
    d = len(perm)
    return w.view(heads, d, -1)[:, perm, :].reshape(heads * d, -1)


def _rope_parameters(cfg: Any) -> dict[str, Any]:
    """The block's RoPE parameters. Per-layer-type entries (MiMo-V2-Flash: {"full_attention": {...},
    "sliding_attention": {...}}) resolve to the block's own layer type, `layer_types[0]`."""
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    layer_types = getattr(cfg, "layer_types", None) or []
    if layer_types and isinstance(rope.get(layer_types[0]), dict):
        rope = dict(rope[layer_types[0]])
    return rope


def _set_attention(b: Eagle3Build, wq, wk, wv, wo, heads, kv_heads, head_dim, rope_exponent, exact, how, sources):
    """Store x-space q/k/v (acting on u = x / rms(x)) for `absorb_projection`, and o_proj + config."""
    cfg = b.block_config
    rope = _rope_parameters(cfg)
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 1e4)))
    scaled = rope.get("rope_type", "default") not in ("default", None)
    b.scratch["attention"] = {"q": wq, "k": wk, "v": wv, "exact": exact and not scaled, "how": how, "from": sources}
    b.put("midlayer.self_attn.o_proj.weight", wo, exact and not scaled, sources, how)
    b.config.update(
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta**rope_exponent,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
    )
    if scaled:
        rope.pop("rope_theta", None)
        b.config["rope_scaling"] = rope
        b.scratch["attention"]["how"] += f"; {rope.get('rope_type')} RoPE scaling copied as-is (approximate)"


def attention_gqa(b: Eagle3Build) -> None:
    """GQA block -> Llama GQA. Exact with full RoPE and no bias/QK-norm; partial RoPE is remapped by
    `rope_permutation`; q/k/v biases are dropped and QK-norm is linearised (both approximate).

    Also exact: interleaved RoPE pairs (`rope_interleave` on the block config, ERNIE-4.5) permuted onto Llama's
    half-split pairs, a value scale (`attention_value_scale`, MiMo-V2-Flash) folded into v_proj, and v heads narrower
    than q/k heads zero-padded with matching zero o_proj columns. Dropped (approximate): attention-sink bias, and a
    sliding window (the EAGLE-3 layer attends to the whole context; the same while it fits in the window)."""
    cfg = b.block_config
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // int(cfg.num_attention_heads))
    d_in = b.norm_weight("block.input_layernorm.weight")
    names = {p: f"block.self_attn.{p}_proj.weight" for p in "qkvo"}
    wq, wk, wv, wo = (b.tensor(names[p]) for p in "qkvo")
    # head counts from the tensors: MiMo-V2-Flash's sliding-window attention has twice the config's kv heads
    heads, kv_heads = wq.shape[0] // d, wk.shape[0] // d
    wq, wk, wv = wq * d_in, wk * d_in, wv * d_in  # act on u = x / rms(x)
    notes, exact = [], True
    v_scale = getattr(cfg, "attention_value_scale", None)
    if v_scale is not None and float(v_scale) != 1.0:
        wv = wv * float(v_scale)
        notes.append(f"value scale {float(v_scale):g} folded into v_proj")
    dv = wv.shape[0] // kv_heads
    if dv > d:
        raise CheckpointError(f"attention_gqa: v head dim {dv} exceeds q/k head dim {d}; the EAGLE-3 layer has one")
    if dv < d:
        wv = torch.cat([wv.view(kv_heads, dv, -1), wv.new_zeros(kv_heads, d - dv, wv.shape[-1])], 1)
        wv = wv.reshape(kv_heads * d, -1)
        wo = torch.cat([wo.view(wo.shape[0], heads, dv), wo.new_zeros(wo.shape[0], heads, d - dv)], 2)
        wo = wo.reshape(wo.shape[0], heads * d)
        notes.append(f"v zero-padded {dv}->{d} with zero o_proj columns")
    if b.has("block.self_attn.sinks"):
        notes.append("attention-sink bias dropped (the EAGLE-3 layer has none)")
        exact = False
    layer_types = getattr(cfg, "layer_types", None) or []
    window = getattr(cfg, "sliding_window", None) if layer_types[:1] == ["sliding_attention"] else None
    if window:
        notes.append(f"sliding window ({window} tokens) dropped: attends to the whole context")
        exact = False
    if any(b.has(f"block.self_attn.{p}_proj.bias") for p in "qkv"):
        notes.append("q/k/v bias dropped (the EAGLE-3 layer has none)")
        exact = False
    for p, w, n in (("q", wq, heads), ("k", wk, kv_heads)):
        norm_key = f"block.self_attn.{p}_norm.weight"
        if b.has(norm_key):
            scale = b.norm_weight(norm_key)
            hw = w.view(n, d, -1)
            c = torch.stack([torch.tensor(_fro_rms(hw[i])) for i in range(n)])  # per-head rms estimate
            hw = hw * scale[None, :, None] / c[:, None, None]
            if p == "q":
                wq = hw.reshape(n * d, -1)
            else:
                wk = hw.reshape(n * d, -1)
            notes.append(f"{p}_norm linearised with a weight-based rms estimate")
            exact = False
    # transformers 5 keeps the factor only inside rope_parameters (GLM-4.5, Qwen3-Next, Qwen3.5)
    rope_params = _rope_parameters(cfg)
    prf = float(getattr(cfg, "partial_rotary_factor", None) or rope_params.get("partial_rotary_factor") or 1.0)
    rope_dim = int(d * prf)
    interleaved = bool(getattr(cfg, "rope_interleave", False))
    perm, exponent = rope_permutation(d, rope_dim, 0, interleaved=interleaved)
    if interleaved:
        notes.append("interleaved RoPE pairs permuted onto Llama's half-split pairs")
    if rope_dim != d:
        notes.append(f"partial RoPE ({rope_dim}/{d} dims) remapped onto full RoPE with theta^{exponent:g}")
        exact = False
    wq, wk = _permute_heads(wq, heads, perm), _permute_heads(wk, kv_heads, perm)
    how = "GQA copied" + ("; " + "; ".join(notes) if notes else "")
    _set_attention(b, wq, wk, wv, wo, heads, kv_heads, d, exponent, exact, how, list(names.values()))


def attention_gated(b: Eagle3Build) -> None:
    """Gated GQA (Qwen3-Next/3.5: q_proj emits [q, gate] per head, output *= sigmoid(gate)) -> Llama GQA: the
    gate rows are dropped and sigmoid(gate) is replaced by its value at 0, 0.5, folded into o_proj (approximate)."""
    cfg = b.block_config
    heads = int(cfg.num_attention_heads)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    q_key = "block.self_attn.q_proj.weight"
    wq = b.tensor(q_key)
    q_only = wq.view(heads, 2 * d, -1)[:, :d, :].reshape(heads * d, -1)
    original = b.tensor
    b.tensor = lambda name: q_only if name == q_key else original(name)  # type: ignore[method-assign]
    try:
        attention_gqa(b)
    finally:
        b.tensor = original  # type: ignore[method-assign]
    b.out["midlayer.self_attn.o_proj.weight"] = b.out["midlayer.self_attn.o_proj.weight"] * 0.5
    b.scratch["attention"]["exact"] = False
    b.scratch["attention"]["how"] = (
        "gate rows dropped, sigmoid(gate) ~ 0.5 folded into o_proj; " + b.scratch["attention"]["how"]
    )
    b.provenance["midlayer.self_attn.o_proj.weight"].update(exact=False, how=b.scratch["attention"]["how"])


def attention_mla(b: Eagle3Build) -> None:
    """MLA -> Llama GQA with num_kv_heads = num_heads and head_dim = qk_nope + qk_rope.

    The low-rank norms (q_a_layernorm, kv_a_layernorm) are linearised with weight-based rms estimates; k_rope, shared
    by all heads in MLA, is copied into every head; v is zero-padded to head_dim with matching zero o_proj columns;
    the nope dims ride on near-zero RoPE frequencies (see `rope_permutation`); MLA's softmax scale is folded into q.
    LongCat-Flash's LoRA scaling (`mla_scale_q_lora` / `mla_scale_kv_lora`: q and the kv latent times
    (hidden / rank)^0.5) is folded in exactly. DeepSeek-V3.2's DSA indexer has no EAGLE-3 counterpart and is dropped:
    its top-`index_topk` sparse attention becomes dense attention (the same while the context is at most
    `index_topk` tokens, approximate beyond).
    """
    cfg = b.block_config
    heads = int(cfg.num_attention_heads)
    dn, dr, dv = int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)
    r_kv = int(cfg.kv_lora_rank)
    d = dn + dr
    d_in = b.norm_weight("block.input_layernorm.weight")
    sources = []

    def t(name: str) -> torch.Tensor:
        sources.append(name)
        return b.tensor(name)

    if b.has("block.self_attn.q_a_proj.weight"):
        wqa = t("block.self_attn.q_a_proj.weight") * d_in  # [r_q, H] on u
        wq = t("block.self_attn.q_b_proj.weight") @ (
            b.norm_weight("block.self_attn.q_a_layernorm.weight")[:, None] * wqa
        )
        wq = wq / _fro_rms(wqa)
    else:
        wq = t("block.self_attn.q_proj.weight") * d_in
    wkva = t("block.self_attn.kv_a_proj_with_mqa.weight") * d_in  # [r_kv + dr, H]
    c_kv = _fro_rms(wkva[:r_kv])
    latent = b.norm_weight("block.self_attn.kv_a_layernorm.weight")[:, None] * wkva[:r_kv] / c_kv  # [r_kv, H]
    notes = []
    if getattr(cfg, "mla_scale_q_lora", False) and getattr(cfg, "q_lora_rank", None):
        wq = wq * (b.hidden_size / int(cfg.q_lora_rank)) ** 0.5
        notes.append("LoRA scaling of q folded in")
    if getattr(cfg, "mla_scale_kv_lora", False):
        latent = latent * (b.hidden_size / r_kv) ** 0.5  # scales k_nope and v, not the shared k_rope
        notes.append("LoRA scaling of the kv latent folded in")
    if b.has("block.self_attn.indexer.wq_b.weight"):
        topk = getattr(cfg, "index_topk", "index_topk")
        notes.append(f"DSA indexer dropped: top-{topk} sparse attention becomes dense (same up to {topk} tokens)")
    kvb = t("block.self_attn.kv_b_proj.weight").view(heads, dn + dv, r_kv)
    k_nope = kvb[:, :dn, :] @ latent  # [heads, dn, H]
    v = kvb[:, dn:, :] @ latent  # [heads, dv, H]
    k_rope = wkva[r_kv:].expand(heads, dr, -1)  # [heads, dr, H], shared by all heads
    wk = torch.cat([k_nope, k_rope], dim=1).reshape(heads * d, -1)
    wv = torch.zeros(heads, d, v.shape[-1])
    wv[:, :dv] = v
    wo_src = t("block.self_attn.o_proj.weight").view(-1, heads, dv)
    wo = torch.zeros(wo_src.shape[0], heads, d)
    wo[:, :, :dv] = wo_src
    # MLA's softmax scale (yarn mscale included) vs Llama's head_dim^-0.5 with head_dim = dn + dr.
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    mla_scale = yarn_apply_mscale(getattr(cfg, "rope_parameters", None) or {}, d**-0.5)
    wq = wq * (mla_scale / d**-0.5)
    perm, exponent = rope_permutation(d, dr, dn, interleaved=bool(getattr(cfg, "rope_interleave", True)))
    wq, wk = _permute_heads(wq, heads, perm), _permute_heads(wk, heads, perm)
    how = (
        "MLA expanded to per-head q/k/v: low-rank norms linearised (weight-based rms), shared k_rope copied per head, "
        f"v zero-padded {dv}->{d}, RoPE remapped with theta^{exponent:g}" + "".join(f"; {n}" for n in notes)
    )
    _set_attention(
        b,
        wq,
        wk,
        wv.reshape(heads * d, -1),
        wo.reshape(wo.shape[0], -1),
        heads,
        heads,
        d,
        exponent,
        False,
        how,
        sources,
    )


def absorb_projection(b: Eagle3Build) -> None:
    """Fold enorm/hnorm/eh_proj into the 2H-wide q/k/v and initialise fc (see the module docstring)."""
    att = b.scratch.get("attention")
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
    q_new, k_new, v_new = torch.zeros(extra * d, 2 * h), torch.zeros(extra * d, 2 * h), torch.zeros(extra * d, 2 * h)
    o_new = torch.zeros(h, extra * d)
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
    from .draft import ComposedBlock

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
    with torch.no_grad():
        out = router(x)
    weights, index = out[1], out[2]
    if weights.shape != index.shape:  # routers returning dense [tokens, E] scores
        weights = weights.gather(1, index)
    freq = torch.zeros(n_experts).index_add_(0, index.flatten(), torch.ones(index.numel()))
    total = torch.zeros(n_experts).index_add_(0, index.flatten(), weights.flatten().float())
    return freq / samples, total / freq.clamp(min=1)


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
            gates.append(b.tensor(prefix + "gate_proj.weight"))
            ups.append(b.tensor(prefix + "up_proj.weight"))
            downs.append(b.tensor(prefix + "down_proj.weight") * scale)
            sources.append(prefix + "*")
    shared = sum(g.shape[0] for g in gates)
    budget = int(b.target_text_config.get("intermediate_size") or (shared + top_k * expert_size))
    m = min(n_experts, max(top_k, (budget - shared) // expert_size))
    chosen = torch.argsort(freq, descending=True, stable=True)[:m].tolist()
    for e in sorted(chosen):
        g, u, dn = b.expert(e)
        gates.append(g)
        ups.append(u)
        downs.append(dn * float(mean_w[e]))
    sources.append(f"block.mlp.experts[{','.join(map(str, sorted(chosen)))}]")
    how = (
        f"shared expert(s) + {m}/{n_experts} routed experts most selected under random unit-rms inputs, "
        "down_proj scaled by mean routing weight"
    )
    b.put("midlayer.mlp.gate_proj.weight", torch.cat(gates), False, sources, how)
    b.put("midlayer.mlp.up_proj.weight", torch.cat(ups), False, sources, how)
    b.put("midlayer.mlp.down_proj.weight", torch.cat(downs, dim=1), False, sources, how)
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


EAGLE3_TRANSFORMS: dict[str, Callable[[Eagle3Build], None]] = {
    "attention_gqa": attention_gqa,
    "attention_gated": attention_gated,
    "attention_mla": attention_mla,
    "absorb_projection": absorb_projection,
    "mlp_dense": mlp_dense,
    "mlp_moe_to_dense": mlp_moe_to_dense,
    "norms": norms,
    "lm_head_from_target": lm_head_from_target,
}


def check_spec_transforms(spec: Any) -> None:
    """Every transform a spec names exists in these registries (`SpecError` otherwise). Checked here, where the
    registries live, so that loading specs stays free of torch; `layout` calls it before using a spec's names."""
    where = spec.path or spec.name
    for name in spec.block.load:
        if name not in LOAD_TRANSFORMS:
            raise SpecError(f"{where}: block.load names unknown transform {name!r}; known: {sorted(LOAD_TRANSFORMS)}")
    for name in spec.eagle3.transforms:
        if name not in EAGLE3_TRANSFORMS:
            raise SpecError(
                f"{where}: eagle3.transforms names unknown transform {name!r}; known: {sorted(EAGLE3_TRANSFORMS)}"
            )
