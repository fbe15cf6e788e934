"""The data-dependent setup of an EAGLE-3 draft, before training: its draft vocabulary and its calibration.

- draft vocabulary (`--draft-vocab-size`): the most frequent target ids among the training targets; the draft's
  head gets those rows of the target's head and the d2t / t2d maps;
- calibration of a draft converted from an MTP layer (`mtp2draft_init` in its config): `fc` refitted on real
  activations and, with the MTP layer's attention at hand, per-head q/k/v scales (see `calibrate_eagle3`).

What this module does not do: train (`train/ttt.py`, `train/recipe.py`), run the target (it is handed `Features`), or
convert checkpoints (`conversion.py` builds the native layer it compares with).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mtp2draft.data import Example
from mtp2draft.draft.eagle3 import Eagle3Draft, vocab_maps
from mtp2draft.draft.modules import NativeMtpDraft
from mtp2draft.kinds import PROVENANCE_FILE, DraftKind
from mtp2draft.progress import Progress
from mtp2draft.target.hidden import Features
from mtp2draft.train.ttt import shift


def token_counts(examples: Sequence[Example], vocab_size: int) -> torch.Tensor:
    """How often each target id occurs among the training targets (loss tokens): [vocab_size] int64."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ex in examples:
        ids = torch.tensor(ex.input_ids)[torch.tensor(ex.loss_mask)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def choose_draft_vocab(examples: Sequence[Example], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent target ids among the training targets (loss tokens), sorted ascending."""
    counts = token_counts(examples, vocab_size)
    # ties broken by id so the choice is deterministic
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.int64)


def narrow_vocab(draft: Eagle3Draft, used: torch.Tensor, target_head: torch.Tensor) -> None:
    """Give an EAGLE-3 draft the draft vocabulary `used`: lm_head rows from the target's head, d2t/t2d."""
    d2t, t2d = vocab_maps(used, draft.vocab_size)
    head = torch.nn.Linear(draft.hidden_size, used.numel(), bias=False, dtype=draft.lm_head.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(target_head[used].to(head.weight.dtype))
    draft.lm_head = head
    draft.d2t, draft.t2d = d2t, t2d
    draft.eagle_config["draft_vocab_size"] = int(used.numel())


def calibrate_eagle3(
    draft: Eagle3Draft,
    features: Features,
    mask: torch.Tensor | None = None,
    native: NativeMtpDraft | None = None,
    input_ids: torch.Tensor | None = None,
    iterations: int = 100,
) -> dict | None:
    """Complete the MTP -> EAGLE-3 mapping on real activations (see transforms.py); only for drafts whose config
    says calibration is pending.

    1. fc: the MTP layer read `P_h hnorm(h)` of the target's final hidden h, fc only sees the three aux layers. At
       conversion fc's high slot holds `P_h diag(hnorm)`; here fc is refitted by ridge regression so that
       `fc(aux) ~ P_h diag(hnorm) h / rms(h)` over the batch's tokens: the best linear stand-in for what the MTP layer
       saw. (Only the rms scale when the final hidden is not available.)
    2. attention scales (with the native MTP layer, for its attention internals): the conversion replaced rms values
       inside the attention by weight-based estimates (rms of the projected input, MLA's low-rank norms), which are
       off on real, anisotropic activations. One scale per head for each of q, k and v is fitted (Adam on the
       log-scales, weights otherwise untouched) so that the EAGLE-3 attention output matches what the MTP layer adds
       to its residual stream: its attention output plus the embedding term the pass-through heads carry.
    """
    init = draft.eagle_config.get("mtp2draft_init")
    if not init or init.get("fc_scale_calibrated", True):
        return None
    aux = features.step0_input(DraftKind.EAGLE3).float()  # [B, T, 3Ht]
    b, t = aux.shape[:2]
    ht = aux.shape[-1] // 3
    keep = mask.reshape(-1).bool() if mask is not None else torch.ones(b * t, dtype=torch.bool)
    x = aux.reshape(-1, 3 * ht)[keep].double()  # [N, 3Ht]
    out: dict[str, Any] = {}
    with torch.no_grad():
        if features.final is None:
            rms = float(x[:, 2 * ht :].pow(2).mean().sqrt())
            draft.fc.weight[:, 2 * ht :] /= rms
            init.update(fc_scale_calibrated=True, high_aux_rms=rms)
            return {"high_aux_rms": rms}
        h = features.final.float().reshape(-1, features.final.shape[-1])[keep].double()  # [N, H]
        h = h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        w0 = draft.fc.weight[:, 2 * ht :].double()  # [H, Ht] = P_h diag(hnorm)
        y = h @ w0.T  # [N, H]: what the MTP layer's projection read from the hidden side
        gram = x.T @ x
        ridge = 1e-3 * gram.diagonal().mean()
        w = torch.linalg.solve(gram + ridge * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y)  # [3Ht, H]
        r2 = float(1 - (y - x @ w).pow(2).sum() / (y - y.mean(0)).pow(2).sum())
        draft.fc.weight.copy_(w.T.to(draft.fc.weight.dtype))
    out.update(fc_fit_r2=r2, tokens=int(x.shape[0]))
    init.update(fc_fit="ridge", fc_fit_r2=r2, fc_fit_tokens=int(x.shape[0]))
    if native is not None and input_ids is not None:
        out.update(_fit_attention_scales(draft, native, features, input_ids, mask, iterations))
        init.update(attention_scale_fit={k: v for k, v in out.items() if k.startswith("attention")})
    init["fc_scale_calibrated"] = True
    return out


def _fit_attention_scales(draft, native, features, input_ids, mask, iterations: int) -> dict[str, float]:
    """Per-head scales of q, k, v fitted to the native layer's residual update (see calibrate_eagle3)."""
    from torch.func import functional_call

    b, t = input_ids.shape
    tokens = shift(input_ids, 1)  # step 0 reads x[p + 1]
    pos = torch.arange(t).expand(b, -1) + 1
    valid = (mask.bool() if mask is not None else torch.ones(b, t, dtype=torch.bool)) & shift(
        torch.ones_like(input_ids, dtype=torch.bool), 1, False
    )
    with torch.no_grad():
        e = F.embedding(tokens, native.embed_weight).float()  # [B, T, H]
        e_hat, h_hat = native.enorm(e), native.hnorm(features.final.float())
        zeros = torch.zeros_like(h_hat)
        first = native.spec.layer.concat == "embed_hidden"
        x = native.eh_proj(torch.cat([e_hat, h_hat] if first else [h_hat, e_hat], -1))  # MTP block input
        x_e = native.eh_proj(torch.cat([e_hat, zeros] if first else [zeros, e_hat], -1))  # its embedding term
        blk = native.block
        mask_n = native.default_mask(x) if hasattr(native, "default_mask") else None
        a_n = blk.self_attn(
            hidden_states=blk.input_layernorm(x),
            position_embeddings=native.rotary_emb(x, pos, **native._rotary_kwargs)
            if native.rotary_emb is not None
            else None,
            attention_mask=mask_n,
            position_ids=pos,
        )
        a_n = a_n[0] if isinstance(a_n, tuple) else a_n
        want = (a_n + x_e)[valid]  # what the MTP layer adds to the P_h hnorm(h) part of its residual
        hidden = draft.initial_hidden(features.aux)
        mid = draft.midlayer
        xin = torch.cat([mid.input_layernorm(e.to(hidden.dtype)), mid.hidden_norm(hidden)], -1)  # [B, T, 2H]
        pe = draft.rotary_emb(hidden, pos)
    attn = mid.self_attn
    heads, kv, d = draft.config.num_attention_heads, draft.config.num_key_value_heads, attn.head_dim
    base = {f"{p}_proj.weight": getattr(attn, f"{p}_proj").weight.detach().clone() for p in "qkvo"}
    logs = {p: torch.zeros(heads if p == "q" else kv, requires_grad=True) for p in "qkv"}
    opt = torch.optim.Adam(logs.values(), lr=0.05)

    def scaled() -> dict[str, torch.Tensor]:
        out = dict(base)
        for p, n in (("q", heads), ("k", kv), ("v", kv)):
            w = base[f"{p}_proj.weight"]
            out[f"{p}_proj.weight"] = (w.view(n, d, -1) * logs[p].exp()[:, None, None].to(w.dtype)).reshape_as(w)
        return out

    def error() -> torch.Tensor:
        got, _ = functional_call(attn, scaled(), (xin,), {"position_embeddings": pe, "attention_mask": None})
        return (got[valid] - want).pow(2).mean() / want.pow(2).mean()

    with torch.no_grad():
        before = float(error())
    for _ in range(iterations):
        loss = error()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(error())
        for name, w in scaled().items():
            getattr(attn, name.split(".")[0]).weight.copy_(w)
    return {"attention_rel_error_before": before, "attention_rel_error_after": after}


def _native_attention(draft_dir: str | Path, embed: torch.Tensor, progress: Progress) -> NativeMtpDraft | None:
    """The attention side of the MTP layer an EAGLE-3 draft was converted from (its provenance names the source):
    norms, projection and attention only — the experts are never read. None, with a note, when unreachable."""
    from mtp2draft.draft.layout import load_native
    from mtp2draft.settings import HubAccess

    prov_path = Path(draft_dir) / PROVENANCE_FILE
    prov = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    source = prov.get("source")
    if not source:
        return None
    parts = ("enorm", "hnorm", "eh_proj", "block.input_layernorm", "block.self_attn")
    try:
        local = Path(source).is_dir()
        revision = None if local else prov.get("commit")
        hub = HubAccess(revision=revision)
        native = load_native(source, prov.get("mtp_layer"), hub=hub, attach_target=False, parts=parts)
    except Exception as exc:  # calibration is an improvement, not a requirement
        progress(f"note: could not read the MTP layer from {source} ({exc}); calibrating fc only")
        return None
    native.embed_weight = embed.float()
    return native.eval()


def choose_and_narrow(
    draft,
    size: int | None,
    examples: Sequence[Example] | None,
    head: torch.Tensor,
    progress: Progress,
    fresh: bool = True,
) -> None:
    """`--draft-vocab-size`: narrow an EAGLE-3 draft to the `size` most frequent training targets.

    Refused for native MTP drafts (they share the target's head), beyond the target vocabulary, and without
    examples to count (offline hidden states). Nothing happens when the draft already has that size, or on a
    resumed run (`fresh` False: the checkpoint holds the narrowed head)."""
    from mtp2draft.errors import DataError

    if not size:
        return
    check_draft_vocab_size(draft.kind, size, draft.vocab_size if fresh else None)
    if not fresh:
        return
    if examples is None:
        raise DataError("--draft-vocab-size needs --data (token counts) rather than --hidden-states")
    if size == draft.draft_vocab_size:
        return
    used = choose_draft_vocab(examples, draft.vocab_size, size)
    narrow_vocab(draft, used, head.float())
    counts = token_counts(examples, draft.vocab_size)
    share = counts[used].sum().item() / max(counts.sum().item(), 1)
    progress(f"draft vocabulary: the {used.numel()} most frequent target tokens, {share:.1%} of the training targets")


def check_draft_vocab_size(kind: str, size: int | None, vocab_size: int | None) -> None:
    """`--draft-vocab-size` makes sense for the draft kind and the target vocabulary (None: not known yet)."""
    from mtp2draft.errors import DataError

    if not size:
        return
    if kind == DraftKind.MTP:
        raise DataError("--draft-vocab-size applies to eagle3 drafts; a native MTP draft shares the target's head")
    if vocab_size is not None and size > vocab_size:
        raise DataError(f"--draft-vocab-size {size} exceeds the target vocabulary {vocab_size}")


def calibrate_pending(
    draft,
    draft_dir: str | Path,
    first_batch: Callable[[], tuple[dict[str, torch.Tensor], Features]],
    embed: torch.Tensor,
    progress: Progress,
) -> dict | None:
    """Calibrate an EAGLE-3 draft whose config says calibration is pending (see `calibrate_eagle3`) on the batch
    `first_batch()` gives, with the MTP layer it came from when that is reachable; logs the fit. None when there is
    nothing to do (the batch is then not computed)."""
    if not isinstance(draft, Eagle3Draft) or not draft.eagle_config.get("mtp2draft_init"):
        return None
    batch, features = first_batch()
    native = _native_attention(draft_dir, embed, progress)
    calibration = calibrate_eagle3(draft, features, batch["attention_mask"], native, batch["input_ids"])
    if calibration and "fc_fit_r2" in calibration:
        note = (
            f"fitted fc to the MTP layer's input on {calibration['tokens']} tokens (R^2 {calibration['fc_fit_r2']:.3f})"
        )
        if "attention_rel_error_after" in calibration:
            note += (
                f"; attention scales: relative error {calibration['attention_rel_error_before']:.3f} -> "
                f"{calibration['attention_rel_error_after']:.3f}"
            )
        progress(note)
    elif calibration:
        progress(f"calibrated fc: rms of the high aux layer {calibration['high_aux_rms']:.4g}")
    return calibration
