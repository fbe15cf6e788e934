"""Released config files kept verbatim in tests/data/releases/<family>/<release>/ (config.json, and
tokenizer_config.json / generation_config.json where a public copy was found; SOURCES.md cites each), and the one
function that makes a tiny checkpoint's config of one: `shrink`.

`shrink` edits size fields only (widths, layer / head / expert counts, LoRA ranks, head and RoPE dims including
mrope_section, the sliding-window layers' own head counts and dims, vocabulary, the indexer's sizes, per-layer lists cut
to the layer count keeping every kind of layer the release has and the MTP layers' entries past the trunk), wherever
they appear (top level or a nested text config), to fixed tiny values; every other key, RoPE scaling, quantization_config, token ids, flags, keeps the release's value and type. The tiny values keep
the relations a release's shapes obey (kv heads dividing heads, expert groups dividing experts, a vocabulary holding
every token id the config names, dense layers fewer than layers).

What this module does not do: write tensors (support/fixtures.build_fixture does, with the family fixture row
naming the hub layout) or decide which stages a family runs (the test does, from the spec).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RELEASES_DIR = Path(__file__).resolve().parents[1] / "data" / "releases"

# field -> tiny value, where the field holds a size
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_attention_heads": 4,
    "swa_num_attention_heads": 4,  # MiMo-V2.x's sliding-window layers (and MTP block) name their own sizes
    "swa_v_head_dim": 16,
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "index_topk": 4,
    "n_routed_experts": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
}
HEAD_DIM = 32  # attention head width where it is its own field (not MLA's RoPE dim)
# one entry per trunk layer: cut with the layer count (`_cut_layers`); Nemotron-H's layers_block_type is also its
# layer count where the release has no num_hidden_layers (Nemotron-3 Ultra). A list with entries past the trunk
# (DeepSeek-V4's compress_ratios: num_hidden_layers + one per MTP layer) keeps those, the MTP layers', after the cut.
PER_LAYER = ("layer_types", "layers_block_type", "mlp_layer_types", "indexer_types", "compress_ratios")
TINY_LAYERS = 5  # trunk layers (`num_hidden_layers`): an EAGLE-3 draft fuses three, numbered from 1 for SGLang
MIN_VOCAB = 256  # the character tokenizer's vocabulary (tests/support/fixtures.write_char_tokenizer)
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _token_ids(config: dict[str, Any]) -> list[int]:
    out: list[int] = []
    for key in TOKEN_ID_FIELDS:
        value = config.get(key)
        out += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)]
    return out


def _shrunk_section(section: dict[str, Any]) -> dict[str, Any]:
    """One config section with its size fields tiny (`TINY` and the relations in the module docstring)."""
    out = dict(section)
    for key, tiny in TINY.items():
        if key in out and isinstance(out[key], int):
            out[key] = min(out[key], tiny)
    heads, kv = section.get("num_attention_heads"), section.get("num_key_value_heads")
    if isinstance(kv, int):  # MHA stays MHA; GQA keeps fewer kv heads than heads
        out["num_key_value_heads"] = out["num_attention_heads"] if kv == heads else min(kv, 2)
    swa_kv = section.get("swa_num_key_value_heads")
    if isinstance(swa_kv, int) and isinstance(kv, int):  # the SWA kv heads a multiple of the kv heads, as published
        ratio = swa_kv // kv if swa_kv % kv == 0 else 1
        out["swa_num_key_value_heads"] = min(swa_kv, out["num_key_value_heads"] * ratio)
    if isinstance(section.get("num_hidden_layers"), int):
        out["num_hidden_layers"] = min(section["num_hidden_layers"], TINY_LAYERS)
    if isinstance(section.get("first_k_dense_replace"), int):
        out["first_k_dense_replace"] = min(
            section["first_k_dense_replace"], out.get("num_hidden_layers", TINY_LAYERS) - 1
        )
    if isinstance(section.get("n_group"), int):  # expert groups divide the experts; at most half are kept
        out["n_group"] = min(section["n_group"], 2)
        out["topk_group"] = min(section.get("topk_group", 1), max(out["n_group"] // 2, 1))
    if "qk_head_dim" in section:  # MLA: the query/key width is the no-RoPE part plus the RoPE part
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
    if "head_dim" in section and "qk_rope_head_dim" in section:  # MLA releases name the RoPE dim head_dim too
        out["head_dim"] = out["qk_rope_head_dim"] if section["head_dim"] == section["qk_rope_head_dim"] else 16
    elif "head_dim" in section:
        out["head_dim"] = min(section["head_dim"], HEAD_DIM)
    if isinstance(section.get("swa_head_dim"), int):
        out["swa_head_dim"] = min(section["swa_head_dim"], HEAD_DIM)
    if isinstance(section.get("linear_num_value_heads"), int):  # value heads a multiple of key heads, as published
        ratio = section["linear_num_value_heads"] // max(section.get("linear_num_key_heads", 1), 1)
        out["linear_num_value_heads"] = out.get("linear_num_key_heads", 1) * max(ratio, 1)
    for key in PER_LAYER:
        if isinstance(section.get(key), list):
            trunk = section.get("num_hidden_layers", len(section[key]))
            cut = _cut_layers(section[key][:trunk], out.get("num_hidden_layers", TINY_LAYERS))
            out[key] = cut + section[key][trunk:]
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(section.get(key), dict) and "mrope_section" in section[key]:
            out[key] = {**section[key], "mrope_section": _mrope(section[key], out)}
    if isinstance(section.get("vocab_size"), int):  # every token id the config names stays inside the vocabulary
        out["vocab_size"] = min(section["vocab_size"], max(MIN_VOCAB, 1 + max(_token_ids(section), default=0)))
    return out


def _cut_layers(types: list[Any], n: int) -> list[Any]:
    """A per-layer list cut to `n` layers: its first `n` entries where they hold every kind the release has, else
    the release's first layer of each kind, its last layer (the one whose output the final norm and the MTP layer
    read) and its earliest other layers, in the release's order (Nemotron-3 Ultra's first attention layer is its 8th);
    longer than `n` only where the release has more kinds than `n`."""
    if len(types) <= n or set(types[:n]) == set(types):
        return types[:n]
    keep = {types.index(kind) for kind in dict.fromkeys(types)} | {len(types) - 1}
    keep |= set([i for i in range(len(types)) if i not in keep][: max(n - len(keep), 0)])
    return [types[i] for i in sorted(keep)]


def _mrope(rope: dict[str, Any], section: dict[str, Any]) -> list[int]:
    """mrope_section (rotary pairs per axis: temporal, height, width) rescaled to the tiny head's rotary pairs,
    head_dim x partial_rotary_factor / 2, in the published proportions (the remainder to the first axis)."""
    published = rope["mrope_section"]
    prf = rope.get("partial_rotary_factor", section.get("partial_rotary_factor", 1.0))
    pairs = int(section["head_dim"] * prf) // 2
    out = [v * pairs // sum(published) for v in published]
    out[0] += pairs - sum(out)
    return out


def shrink(config: dict[str, Any], text_config: str = "") -> dict[str, Any]:
    """A release's config.json with its size fields tiny (top level and `text_config`, where the spec nests one);
    every other key and value as published."""
    out = _shrunk_section(copy.deepcopy(config))
    if text_config and isinstance(out.get(text_config), dict):
        out[text_config] = _shrunk_section(out[text_config])
    return out


@dataclass(frozen=True)
class Release:
    family: str  # the spec's name (the folder under tests/data/releases)
    name: str  # the release (its folder)
    path: Path

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"

    def config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text(encoding="utf-8"))

    def chat_template(self) -> str | None:
        """The release's chat template: chat_template.jinja, else tokenizer_config.json's `chat_template`."""
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        tok = self.path / "tokenizer_config.json"
        if tok.is_file():
            return json.loads(tok.read_text(encoding="utf-8")).get("chat_template")
        return None


def releases() -> list[Release]:
    """Every release in the corpus, sorted."""
    return [
        Release(path.parent.name, path.name, path)
        for path in sorted(RELEASES_DIR.glob("*/*"))
        if (path / "config.json").is_file()
    ]
