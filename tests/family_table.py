"""What the family tests (tests/test_families.py) expect of each family's fixture, spec and MTP layer: one row per
family, data only. A family whose block kind exists is added as one spec file (model_specs/), one data file
(tests/data/families/) and one row here; the tests read every row.

Where a row names a key prefix it is the fixture's (tiny: 2 to 4 trunk layers); `release_block` is the release's
(47 to 80 trunk layers), read from the committed key list (tests/data/hub_keys/<family>.json); a row with no stored
key list (`stored=False`) gives the names the engines' loaders map instead (`keys`), where they are known. Every
family with a native MTP layer is a row, the FP8 releases of a layout its `variants`. `reference` names the
computation the layer is held to (tests/support/references.py); `wrong` lists variants of it that get one detail
wrong, each of which the layer must differ from, so every check can fail.

What this module does not do: hold family-specific checks that fit no column (they are tests of their own in
tests/test_families.py, named after the family).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from support import reference_v4 as rv4
from support import references as ref

T = 10  # the forward checks' sequence length: longer than every fixture's window (4) and index_topk (4)
ENGINE_VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}  # the engine versions the specs' facts were read from
NESTED = ("text_config", "llm_config")  # config sections whose field names are checked against the release's too


@dataclass(frozen=True)
class Family:
    fixture: str  # the fixture's data file and the spec's name
    mtp: str  # prefix of every MTP tensor of the fixture
    release_block: str | None  # the release's MTP block prefix (spec.keys.block at the release's config), if stored
    block: str  # `inspect --json`'s block kind
    verified: bool  # the spec's verified flag (a stored key list of the release was found)
    handover: dict[str, str]  # engine -> hidden handed on ("pre_norm" / "post_norm"); engines absent serve nothing
    step_layers: dict[str, str]  # engine -> which MTP layers its steps use ("cycle" / "first")
    support: dict[str, dict[str, bool]]  # spec.support_table()
    sources: dict[str, tuple[str, ...]]  # engine -> words its sources must name
    module: dict[str, Any]  # attribute path of the native module (":type" / ":dtype" / ":shape" read them) -> value
    reference: Callable  # references.<family>: (path, nxt, hidden, pos, **variant) -> (logits, hand-over)
    wrong: tuple[dict[str, Any], ...] = ()  # variants of `reference` the layer must differ from
    refuses_eagle3: str | None = None  # the refusal's words, where no EAGLE-3 conversion fits
    release_tensors: int | None = None  # the release's MTP tensor count, where the key list gives one
    experts: str | None = None  # the (text) config field counting routed experts, where the MTP layer has them
    exact_keys: bool = False  # the fixture's MTP keys are the release's to the letter (no indices to abstract)
    vllm_loads: Callable[[str], str] | None = None  # a release key as vLLM's loader maps it (checked: vllm_params)
    release_is: tuple[str, str] | None = None  # (family, prefix): the release's MTP keys are that family's under prefix
    keys_present: tuple[str, ...] = ()  # keys the fixture also has (the trunk under its release's prefix)
    prefixes_present: tuple[str, ...] = ()  # prefixes some fixture key has (towers beside the text model)
    prefixes_absent: tuple[str, ...] = ()  # prefixes no fixture key has
    same_names: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (trunk prefixes, MTP block prefixes): the
    # block's names, glue aside, are the trunk's (transformers' save_pretrained writes the trunk)
    stored_embed: str | None = None  # the MTP layer's stored embedding copy (shared with the target's, not read)
    stored_head: str | None = None
    # (engine the layer is trained for, None: as converted; the reference's variant computing that engine's hand-over)
    engines: tuple[tuple[str | None, dict[str, Any]], ...] = ((None, {}),)
    nope: bool = False  # no position embeddings: shifting every position changes nothing
    variants: tuple[str, ...] = ()  # other fixtures of the family (FP8 releases) converted like it
    eagle3_how: dict[str, tuple[str, ...]] = field(default_factory=dict)  # EAGLE-3 tensor -> words of its "how"
    nextn: str | None = None  # spec.nextn.architecture
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # engine -> words its notes must name
    aux_ids: dict[str, str] = field(default_factory=dict)  # engine -> how it numbers EAGLE-3 aux layers
    spec: str | None = None  # the spec's name, where it is not the fixture's
    stored: bool = True  # tests/data/hub_keys/<fixture>.json holds the release's key list (else: `keys`, if any)
    keys: tuple[
        str, ...
    ] = ()  # no stored key list: the MTP layer's keys to the letter, as the engines' loaders name them
    layers: int = 1  # MTP layers of the fixture (`mtp` is layer 0's prefix; each layer is converted)
    trunk_reads: tuple[str, ...] = ()  # trunk tensors the layer reads too (ERNIE's final norm is the trunk's)
    fp8_weights: int = 0  # FP8 weights of MTP layer 0, where the fixture is itself an FP8 release
    final_norm: dict[str, bool] = field(default_factory=dict)  # engine -> False where it applies no final norm
    eagle3_exact: dict[str, bool] = field(default_factory=dict)  # EAGLE-3 tensor -> whether its provenance says exact
    eagle3_norm: bool = False  # the EAGLE-3 norm is the MTP layer's zero-centred final norm, 1 + w folded
    fp8_dtypes: dict[str, str] = field(
        default_factory=dict
    )  # FP8 variant: MTP key (after `mtp`) -> dtype ("": unscaled)
    cache_chunks: tuple[int, ...] = ()  # cached steps (chunk bounds up to T) that must equal one pass
    masked: bool = (
        False  # the layer also takes an explicit causal mask (as the DSA indexer reads it) to the same result
    )
    streams: int = 0  # residual streams of the hidden (hyper-connections): hidden [B, T, streams, H]; 0: [B, T, H]
    hidden: str | dict[str, str] = (
        "post_norm"  # the target hidden the engines feed step 0 (engine -> it, if they differ)
    )
    versions: dict[str, str] = field(default_factory=dict)  # engine -> the version its facts were read from, where
    # it is not ENGINE_VERSIONS'
    scales_absent: bool = False  # the bf16 fixture leaves out the release's `.scale` siblings (FP8 / FP4 e8m0)
    variant_fp8_weights: int = 0  # FP8 weights (each with its `_scale_inv`) of MTP layer 0 in the FP8 variant


_BOTH = {"vllm": "post_norm", "sglang": "post_norm"}
_CYCLE_FIRST = {"vllm": "cycle", "sglang": "first"}
_NEMOTRON_MODULE = {
    "block.self_attn:type": "NemotronHAttention",
    "rotary_emb": None,
    "block.mlp.experts.up_proj:shape": (8, 32, 32),  # [E, I, latent]
}
_LM = "language_model."
# what the two omni layouts share: the text release's model under language_model., towers beside it
_OMNI = {
    "module": _NEMOTRON_MODULE,
    "reference": ref.nemotron_h_vllm,
    "wrong": ({"sublayers": (_LM + "backbone.layers.2.", _LM + "backbone.layers.3.")},),
    "release_tensors": 1040,
    "experts": "n_routed_experts",
    "keys_present": (_LM + "backbone.embeddings.weight", _LM + "lm_head.weight", _LM + "backbone.norm_f.weight"),
    "prefixes_present": ("vision_model.",),
    "nope": True,
}

_NO_RULE = {"vllm": "", "sglang": ""}  # the spec states no step rule
_Q = "midlayer.self_attn.q_proj.weight"
# what the Qwen3 hybrids share: mtp.* glue, zero-centred norms, a gated full-attention block, both engines both ways
_QWEN3 = {
    "handover": _BOTH,
    "step_layers": _NO_RULE,
    "support": {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
    "sources": {"vllm": ("mtp.py",), "sglang": ("mtp.py",)},
    "aux_ids": {"sglang": "plus_one"},
    "reference": ref.qwen3_hybrid,
    # the norms are zero-centred, the attention output gated by sigmoid(gate), the projection reads [embed, hidden]
    "wrong": ({"norm": "standard"}, {"gate": False}, {"order": "hidden_embed"}),
    "stored": False,
    # partial_rotary_factor 0.25, read from rope_parameters
    "eagle3_how": {
        _Q: ("gate rows dropped", "q_norm linearised", "partial RoPE (8/32 dims)"),
        "norm.weight": ("1 + w folded",),
    },
    "eagle3_exact": {"norm.weight": True},
    "eagle3_norm": True,
}
_DEEPSEEK = {  # what DeepSeek-V3 and V3.2 share: the layer at model.layers.{N} with stored embedding and head copies
    "handover": _BOTH,
    "step_layers": _NO_RULE,
    "support": {"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
    "aux_ids": {"sglang": "plus_one_if_first_is_one"},
    "stored": False,
    "experts": "n_routed_experts",
    "stored_embed": "model.layers.2.embed_tokens.weight",
    "stored_head": "model.layers.2.shared_head.head.weight",
    "nextn": "DeepseekV3ForCausalLMNextN",
}
_GLM4_MOE = {  # the glm4_moe spec's facts and the block transformers' MtpModel computes
    "handover": {"vllm": "pre_norm", "sglang": "post_norm"},  # vLLM's forward returns residual + block output
    "step_layers": _NO_RULE,
    "support": {"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}},
    "sources": {"vllm": ("glm4_moe_mtp.py",), "sglang": ("glm4_moe_nextn.py",)},
    "aux_ids": {"sglang": "plus_one"},
    "module": {"block:type": "Glm4MoeDecoderLayer", "block.mlp:type": "Glm4MoeMoE"},
    "reference": ref.transformers_mtp_model,
    "stored": False,
    "experts": "n_routed_experts",
    "nextn": "Glm4MoeForCausalLMNextN",
}
_QWEN3_5_MODULE = {"block.block_type": "full_attention", "block.self_attn:type": "Qwen3_5Attention",
                   "block.mlp:type": "Qwen3_5MLP"}  # fmt: skip

# a row's identity on one line: rows of a table are alike by design, and unpacked they read as copies
# fmt: off
FAMILIES = (
    Family("glm4_moe_lite", mtp="model.layers.2.", release_block="model.layers.47.", block="mla + moe", verified=True,
        handover={"vllm": "pre_norm", "sglang": "post_norm"},  # vLLM's forward returns residual + block output
        step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("glm4_moe_lite",), "sglang": ("glm4_moe_lite",)},
        module={"block.mlp:type": "Glm4MoeLiteMoE", "block.self_attn:type": "Glm4MoeLiteAttention"},
        reference=ref.glm4_moe_lite_mtp_model,
        experts="n_routed_experts",
        stored_embed="model.layers.2.embed_tokens.weight",
        stored_head="model.layers.2.shared_head.head.weight",
    ),
    Family("hy_v3", mtp="model.layers.2.", release_block="model.layers.80.", block="gqa + moe", verified=True,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("hy_v3_mtp.py",), "sglang": ("hunyuan_v3_nextn.py",)},
        module={"block.mlp:type": "HYV3MoE", "block.mlp.e_score_correction_bias:dtype": torch.float32},
        reference=ref.hy_v3_vllm,
        wrong=({"block_layer": 1},),  # the trunk's block: the block's own weights matter
        release_tensors=593,
        experts="num_experts",
        same_names=(("model.layers.1.",), ("model.layers.2.",)),
        nextn="HYV3ForCausalLMNextN",
    ),
    Family("nemotron_h", mtp="mtp.", release_block="mtp.layers.", block="gqa_nope + moe", verified=True,
        handover=_BOTH,
        step_layers={"vllm": "first", "sglang": "first"},  # both assert exactly one MTP layer
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("nemotron_h_mtp.py",), "sglang": ("nemotron_h_mtp.py",)},
        module={**_NEMOTRON_MODULE, "block.mlp:type": "NemotronHMoE"},
        reference=ref.nemotron_h_vllm,
        wrong=({"sublayers": ("backbone.layers.2.", "backbone.layers.3.")},),
        refuses_eagle3="nemotron_h has no EAGLE-3 conversion",  # vLLM captures aux states; no transfer fits NoPE
        release_tensors=8 + 1 + 2 + 512 * 2 + 2 + 2 + 1,
        experts="n_routed_experts",
        same_names=(("backbone.layers.2.", "backbone.layers.3."), ("mtp.layers.0.", "mtp.layers.1.")),
        nope=True,
    ),
    Family("nemotron_h_omni", mtp=_LM + "mtp.", release_block=_LM + "mtp.layers.",
        block="gqa_nope + moe", verified=True,
        handover=_BOTH, step_layers={"vllm": "first", "sglang": "first"},
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("nemotron_h_mtp.py",), "sglang": ("nemotron_h_mtp.py",)},
        refuses_eagle3="nemotron_h_omni has no EAGLE-3 conversion",
        release_is=("nemotron_h", _LM),
        same_names=(
            (_LM + "backbone.layers.2.", _LM + "backbone.layers.3."),
            (_LM + "mtp.layers.0.", _LM + "mtp.layers.1."),
        ),
        **_OMNI,
    ),
    Family("nemotron_h_super_omni", mtp="mtp.", release_block="mtp.layers.", block="gqa_nope + moe", verified=False,
        handover={"vllm": "post_norm"},  # SGLang 0.5.23 has no MTP path for this architecture
        step_layers={"vllm": "first"},
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": False, "eagle3": False}},
        sources={"vllm": ("nemotron_h_mtp.py",)},
        notes={"vllm": ("model_config.py",)},
        refuses_eagle3="nemotron_h_super_omni has no EAGLE-3 conversion",
        release_is=("nemotron_h", ""),  # the text release's names, at the top level
        prefixes_absent=(_LM + "mtp.",),
        same_names=((_LM + "backbone.layers.2.", _LM + "backbone.layers.3."), ("mtp.layers.0.", "mtp.layers.1.")),
        **_OMNI,
    ),
    Family("exaone4_5", mtp="mtp.", release_block="mtp.layers.0.", block="swa + dense", verified=False,
        handover={"vllm": "post_norm"},  # SGLang 0.5.23 serves nothing for this target
        step_layers={"vllm": "cycle"},
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": False, "eagle3": False}},
        sources={"vllm": ("exaone4_5_mtp.py",)},
        notes={"vllm": ("exaone_moe_mtp.py",)},
        module={"block:type": "Exaone4DecoderLayer", "block.self_attn.is_sliding": True, "attention_window": 4},
        reference=ref.exaone4_5_vllm,
        wrong=({"window": None},),  # the window is applied and matters
        refuses_eagle3="exaone4_5 has no EAGLE-3 conversion .* served by vllm: use --to mtp",
        exact_keys=True,
        vllm_loads=ref.exaone_vllm_loads,
        same_names=(("model.language_model.layers.0.",), ("mtp.layers.0.",)),
        engines=(("vllm", {}),),
    ),
    Family("exaone_moe", mtp="mtp.", release_block="mtp.layers.0.", block="gqa + dense", verified=False,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("exaone_moe_mtp.py",), "sglang": ("exaone_moe_mtp.py",)},
        aux_ids={"sglang": "plus_one"},
        module={
            "block.mlp:type": "ExaoneMoeMLP",  # dense, as vLLM builds every MTP layer
            "block.self_attn.is_sliding": False,
            "block.self_attn.sliding_window": None,
            "attention_window": None,
        },
        reference=ref.exaone_moe_vllm,
        wrong=({"rope": False},),  # RoPE is applied and matters
        exact_keys=True,
        vllm_loads=ref.exaone_vllm_loads,
        same_names=(("model.layers.0.",), ("mtp.layers.0.",)),
        engines=(("vllm", {}),),
        nextn="ExaoneMoEForCausalLMMTP",
    ),
    Family("bailing_hybrid", mtp="model.layers.4.", release_block="model.layers.42.",
        block="gated_mla + moe", verified=True,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("bailing_moe_v3_mtp.py",), "sglang": ("bailing_moe_nextn.py",)},
        # block_overrides: MLA + MoE, not the trunk's KDA + dense layer 0
        module={
            "block.self_attn:type": "BailingHybridAttention",
            "block.mlp:type": "BailingHybridMoE",
            "block.mlp.gate.e_score_correction_bias:dtype": torch.float32,
        },
        reference=ref.bailing_hybrid_mtp_model,
        refuses_eagle3="bailing_hybrid has no EAGLE-3 conversion",
        release_tensors=17 + 3 * 512,
        experts="num_experts",
        vllm_loads=ref.bailing_vllm_loads,
        same_names=(("model.layers.3.",), ("model.layers.4.",)),  # the trunk's MLA + MoE layer, last of its group
        nextn="BailingMoeForCausalLMNextN",
    ),
    Family("glm_moe_dsa", mtp="model.layers.4.", release_block="model.layers.78.", block="mla_dsa + moe", verified=True,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("deepseek_v32/nvidia/mtp.py",), "sglang": ("GlmMoeDsaForCausalLMNextN",)},
        module={"block.mlp:type": "GlmMoeDsaMoE", "block.self_attn.indexer:type": "GlmMoeDsaIndexer"},
        reference=ref.glm_moe_dsa_vllm,
        # the indexer's top-k selection is applied and matters; GLM's block (interleaved indexer RoPE) is not V3.2's
        wrong=({"index_topk": T}, {"decoder": "v32"}),
        release_tensors=791,
        experts="n_routed_experts",
        variants=("glm_moe_dsa_fp8",), variant_fp8_weights=34,
        eagle3_how={"midlayer.self_attn.q_proj.weight": ("DSA indexer dropped", "same up to 4 tokens")},
        nextn="GlmMoeDsaForCausalLMNextN",
        fp8_dtypes={"self_attn.indexer.wq_b.weight": "F8_E4M3", "eh_proj.weight": ""},
        cache_chunks=(6, T),
    ),
    Family("glm_ocr", mtp="model.language_model.layers.2.", release_block="model.language_model.layers.16.",
        block="gqa + dense", verified=True,
        handover={"vllm": "pre_norm", "sglang": "post_norm"}, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("glm_ocr_mtp.py",), "sglang": ("glm_ocr_nextn.py",)},
        module={"block:type": "GlmOcrTextDecoderLayer", "block.self_attn.head_dim": 24},  # the config's, not 64 / 4
        reference=ref.glm_ocr_vllm,
        wrong=({"block_layer": 1},),
        refuses_eagle3="glm_ocr has no EAGLE-3 conversion .* use --to mtp",
        release_tensors=16,
        stored_embed="model.language_model.layers.2.embed_tokens.weight",
        stored_head="model.language_model.layers.2.shared_head.head.weight",
        engines=(("vllm", {"engine": "vllm"}), ("sglang", {"engine": "sglang"})),
    ),
    Family("deepseek_v32", mtp="model.layers.2.", release_block=None, block="mla_dsa + moe", verified=True,
        **_DEEPSEEK, sources={"vllm": ("deepseek_v32/__init__.py", "mtp.py"), "sglang": ("deepseek_nextn.py",)},
        module={"block.mlp:type": "DeepseekV32MoE"},  # block_overrides: index 0 is the sparse MoE block
        reference=ref.deepseek_v32,
        wrong=({"index_topk": T},),  # the indexer's top-k sparse mask is applied (T > index_topk) and matters
        variants=("deepseek_v32_fp8",), variant_fp8_weights=34,
        eagle3_how={f"midlayer.self_attn.{p}_proj.weight": ("DSA indexer dropped", "same up to 4 tokens") for p in "qkvo"},
        eagle3_exact={f"midlayer.self_attn.{p}_proj.weight": False for p in "qkvo"},
        # FP8 release: the indexer's wq_b / wk are FP8 blocks, weights_proj and k_norm are not
        fp8_dtypes={"self_attn.indexer.wq_b.weight": "F8_E4M3", "self_attn.indexer.wk.weight": "F8_E4M3",
                    "self_attn.indexer.weights_proj.weight": "", "self_attn.indexer.k_norm.weight": ""},
        cache_chunks=(3, 4, 6, T),  # chunks of 3, 1, 2, 4 tokens: each attends to the cached past plus itself
        masked=True,
    ),
    Family("longcat_flash", mtp="model.mtp.", release_block=None, block="mla + dense", verified=True,
        handover=_BOTH, step_layers=_NO_RULE,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("longcat_flash_mtp.py",), "sglang": ("longcat_flash_nextn.py",)},
        aux_ids={"sglang": "plus_one"},
        # the MTP block: MLA with the LoRA norm scaling (hidden / rank)^0.5, one dense SwiGLU of ffn_hidden_size
        module={"block.self_attn:type": "LongcatFlashMLA", "block.mlp:type": "LongcatFlashMLP",
                "block.mlp.gate_proj.weight:shape": (128, 64),
                "block.self_attn.mla_scale_q_lora": (64 / 48) ** 0.5, "block.self_attn.mla_scale_kv_lora": (64 / 32) ** 0.5},
        reference=ref.longcat_flash,
        wrong=({"lora_scaling": False},),
        stored=False, keys=ref.LONGCAT_FLASH_MTP_KEYS,
        stored_embed="model.mtp.embed_tokens.weight",
        nextn="LongcatFlashForCausalLMNextN",
        masked=True,
    ),
    Family("mimo_v2_flash", mtp="model.mtp.layers.0.", release_block=None, block="swa + dense", verified=True,
        handover=_BOTH, step_layers=_NO_RULE,
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("mimo_v2_mtp.py",), "sglang": ("mimo_v2_nextn.py",)},
        module={"block:type": "MiMoV2FlashDecoderLayer", "block.mlp:type": "MiMoV2FlashMLP"},
        reference=ref.mimo_v2_flash,
        # the window, the layer's own weights and the FP8 scales are applied and matter
        wrong=({"window": False}, {"layer": 1}, {"dequant": False}),
        stored=False, keys=ref.mimo_v2_flash_keys(0), layers=3, fp8_weights=7,
        cache_chunks=(6, 7, 8, 9, T),
    ),
    Family("ernie4_5_moe", mtp="model.mtp_", release_block=None, block="gqa + dense", verified=False,
        handover={"vllm": "pre_norm", "sglang": "pre_norm"},  # residual + block output, no final norm
        final_norm={"vllm": False, "sglang": False},
        step_layers=_NO_RULE,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("ernie_mtp.py",), "sglang": ("ernie4_eagle.py",)},
        notes={"vllm": ("No final norm",)},
        # dense even where the trunk's layer 0 would be MoE (moe_layer_start_index = 1)
        module={"block.mlp:type": "Ernie4_5_MoeMLP", "block.mlp.intermediate_size": 128},
        reference=ref.ernie4_5_moe,
        wrong=({"final_norm": None}, {"dense": False}),  # FastDeploy's final norm and the dense MLP matter
        stored=False, keys=ref.ERNIE4_5_MOE_MTP_KEYS, trunk_reads=("model.norm.weight",),
        # as converted last: the training code's computation, which `wrong` is held against; SGLang's row is vLLM's
        engines=(("vllm", {"final_norm": None}), (None, {})),
    ),
    Family("qwen3_next", mtp="mtp.", release_block=None, block="gated_gqa + moe", verified=True, **_QWEN3,
        module={"block.block_type": "full_attention", "block.self_attn:type": "Qwen3NextAttention",
                "block.mlp:type": "Qwen3NextSparseMoeBlock"},  # full attention although the trunk's layer 0 is linear
        nextn="Qwen3NextForCausalLMMTP",
    ),
    # Qwen3.5 / 3.6 and Qwen3.8-27B as released: the vision-language layout, text model under model.language_model.,
    # MTP at mtp.*, tower at model.visual.
    Family("qwen3_5", mtp="mtp.", release_block=None, block="gated_gqa + dense", verified=True, **_QWEN3,
        spec="qwen3_5_text", module=_QWEN3_5_MODULE, nextn="Qwen3_5ForCausalLMMTP",
        prefixes_present=("model.language_model.layers.", "model.visual.", "mtp.layers.0."),
    ),
    Family("qwen3_5_tied", mtp="mtp.", release_block=None, block="gated_gqa + dense", verified=True, **_QWEN3,
        spec="qwen3_5_text", module=_QWEN3_5_MODULE, nextn="Qwen3_5ForCausalLMMTP",
    ),
    Family("qwen3_5_moe", mtp="mtp.", release_block=None, block="gated_gqa + moe", verified=True, **_QWEN3,
        spec="qwen3_5_moe_text", nextn="Qwen3_5ForCausalLMMTP",
        module={"block.block_type": "full_attention", "block.self_attn:type": "Qwen3_5MoeAttention",
                "block.mlp:type": "Qwen3_5MoeSparseMoeBlock"},
    ),
    Family("deepseek_v3", mtp="model.layers.2.", release_block=None, block="mla + moe", verified=True,
        **_DEEPSEEK, sources={"vllm": ("deepseek_mtp.py",), "sglang": ("deepseek_nextn.py",)},
        module={"block:type": "DeepseekV3DecoderLayer", "block.mlp:type": "DeepseekV3MoE",
                "block.mlp.gate.e_score_correction_bias:dtype": torch.float32},
        reference=ref.transformers_mtp_model, variants=("deepseek_v3_fp8",), variant_fp8_weights=32,
    ),
    Family("glm4_moe", mtp="model.layers.2.", release_block=None, block="gqa + moe", verified=True, **_GLM4_MOE,
        stored_embed="model.layers.2.embed_tokens.weight",
        stored_head="model.layers.2.shared_head.head.weight",
    ),
    # GLM-4.6's layout: the glm4_moe spec, no stored embedding or head copy in the MTP layer
    Family("glm4_6", mtp="model.layers.2.", release_block=None, block="gqa + moe", verified=True, spec="glm4_moe",
        **_GLM4_MOE,
    ),
    Family("mimo", mtp="model.mtp_layers.0.", release_block=None, block="gqa + dense", verified=True,
        handover=_BOTH,
        hidden={"vllm": "pre_norm", "sglang": "post_norm"},
        step_layers={"vllm": "first", "sglang": "neither"},  # SGLang 0.5.23 loads every MTP layer onto one
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("eagle.py",), "sglang": ("mimo_mtp.py",)},
        module={"block:type": "Qwen2DecoderLayer", "block.mlp:type": "Qwen2MLP"},
        reference=ref.mimo,
        wrong=({"order": "embed_hidden"},),  # MiMo concatenates [hidden, embed]: the order matters
        stored=False,
    ),
    Family("deepseek_v4", mtp="mtp.", release_block="mtp.0.", block="swa_sink + moe", verified=True,
        handover={"vllm": "pre_norm", "sglang": "pre_norm"},  # both hand on the streams before hc_head
        step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("deepseek_v4/nvidia/mtp.py",), "sglang": ("deepseek_v4_nextn.py",)},
        module={"block:type": "DeepseekV4DecoderLayer", "hc_head:type": "DeepseekV4HyperHead",
                "block.self_attn.compressor": None, "attention_window": 4, "block.mlp.is_hash": False,
                "hidden_shape": (4, 64)},
        reference=rv4.deepseek_v4_vllm,
        wrong=({"window": None}, {"hc_reduce": False}, {"zero_first": True}),  # position 0's embedding kept
        refuses_eagle3="deepseek_v4 has no EAGLE-3 conversion",  # vLLM 0.34 captures aux states; no transfer yet
        release_tensors=1575,
        experts="n_routed_experts",
        engines=((None, {}), ("vllm", {}), ("sglang", {})),
        streams=4,
        hidden="pre_norm",
        versions={"vllm": "0.34.0"},
        scales_absent=True,
    ),
    Family("qwen3_5_moe_flat", mtp="mtp.", release_block="mtp.layers.0.", block="gated_gqa + moe", verified=False,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("qwen3_5_mtp.py", "qwen3_5_moe_text"), "sglang": ("Qwen3_5ForCausalLMMTP", "qwen3_5_text.py")},
        aux_ids={"sglang": "plus_one"},
        module={"block.block_type": "full_attention", "block.self_attn:type": "Qwen3_5MoeAttention",
                "block.mlp:type": "Qwen3_5MoeSparseMoeBlock", "block.mlp.experts.gate_up_proj:shape": (8, 32, 64)},
        reference=ref.qwen3_hybrid,
        wrong=({"norm": "standard"}, {"order": "hidden_embed"}),  # zero-centred norms, [embed, hidden] order
        exact_keys=True,
        vllm_loads=ref.qwen3_5_vllm_loads,
        keys_present=("model.layers.3.self_attn.q_proj.weight", "model.layers.0.linear_attn.A_log"),
        prefixes_absent=("model.language_model.", "model.visual."),  # the flat layout: no VL prefix, no tower
        same_names=(("model.layers.3.",), ("mtp.layers.0.",)),  # the trunk's full-attention MoE layer
        nextn="Qwen3_5ForCausalLMMTP",
    ),
    # Nemotron-3.5 Lightning: nemotron_h's spec with no latent MoE (moe_latent_size null: the experts read hidden_size)
    # and the MTP layer in model_mtp.safetensors, which the index does not list
    Family("nemotron_h_lightning", mtp="mtp.", release_block="mtp.layers.", block="gqa_nope + moe", verified=True,
        spec="nemotron_h", handover=_BOTH,
        step_layers={"vllm": "first", "sglang": "first"},  # both assert exactly one MTP layer
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("nemotron_h_mtp.py",), "sglang": ("nemotron_h_mtp.py",)},
        module={"block.self_attn:type": "NemotronHAttention", "rotary_emb": None, "block.mlp:type": "NemotronHMoE",
                "block.mlp.fc1_latent_proj:type": "Identity", "block.mlp.fc2_latent_proj:type": "Identity",
                "block.mlp.experts.up_proj:shape": (8, 32, 64)},  # [E, I, hidden]: no latent space
        reference=ref.nemotron_h_vllm,
        wrong=({"sublayers": ("backbone.layers.2.", "backbone.layers.3.")},),
        refuses_eagle3="nemotron_h has no EAGLE-3 conversion",
        release_tensors=8 + 1 + 2 + 128 * 2 + 2 + 1,
        experts="n_routed_experts",
        same_names=(("backbone.layers.2.", "backbone.layers.3."), ("mtp.layers.0.", "mtp.layers.1.")),
        nope=True,
    ),
    Family("step3p7", mtp="model.layers.4.", release_block=None, block="headgate_gqa + dense", verified=False,
        handover={"vllm": "pre_norm", "sglang": "pre_norm"},  # both hand on the block output before shared_head.norm
        hidden="pre_norm",  # vLLM's target returns the hidden before model.norm; SGLang prefers it when captured
        step_layers={"vllm": "cycle", "sglang": "cycle"},  # vLLM: spec_step_idx % 3; SGLang: draft runner i, layer i
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("step3p5_mtp.py", "step3p5.py"), "sglang": ("step3p5_mtp.py", "multi_layer_eagle_worker_v2.py")},
        # layer 0 is full attention (the sliding layers' own kind: test_step3p7_every_layer_is_its_own_kind)
        module={"block:type": "Step3p7DecoderLayer", "block.self_attn.num_heads": 4, "block.self_attn.sliding_window": None,
                "block.mlp:type": "Step3p7MLP", "own_head.weight:shape": (256, 64), "own_head.weight.requires_grad": False},
        reference=ref.step3p7,
        wrong=({"layer": 1}, {"head": "target"}),  # the layer's own weights and its own head matter
        refuses_eagle3="step3p7 has no EAGLE-3 conversion",
        # no stored copy of the release's index: the names the engines' loaders map, which a stored test of the
        # ATOM loader (search-index id 65856740998) lists as "every real checkpoint weight name for MTP layers"
        stored=False, keys=ref.step3p7_keys(4), layers=3,
        keys_present=("model.layers.1.moe.gate_proj.weight", "model.layers.1.share_expert.up_proj.weight"),
        prefixes_present=("vision_model.",),
        engines=((None, {"handover": "post_norm"}), ("vllm", {}), ("sglang", {})),
        versions={"vllm": "0.34.0"},
        cache_chunks=(3, 4, 6, T),
    ),
    # Step-5-Preview: the Step-3.7 MTP layer (dense, sliding, own head) at model.layers.{92..94}; no engine lists it
    Family("step3p5v", mtp="model.layers.4.", release_block="model.layers.92.", block="headgate_gqa + dense",
        verified=True, handover={}, hidden="pre_norm", step_layers={},
        support={"vllm": {"mtp": False, "eagle3": False}, "sglang": {"mtp": False, "eagle3": False}}, sources={},
        # every depth sliding, with the sliding layers' own head count (8 where full layers have 4)
        module={"block:type": "Step3p7DecoderLayer", "block.self_attn.num_heads": 8, "block.self_attn.sliding_window": 4,
                "block.mlp:type": "Step3p7MLP", "own_head.weight:shape": (256, 64)},
        reference=ref.step3p7,
        wrong=({"layer": 1}, {"head": "target"}),  # the layer's own weights and its own head matter
        refuses_eagle3="step3p5v has no EAGLE-3 conversion",
        release_tensors=17, exact_keys=False, layers=3,
        keys_present=("model.layers.1.moe.gate_proj.weight", "model.layers.1.share_expert.up_proj.weight"),
        prefixes_present=("vision_model.",),
        engines=((None, {"handover": "post_norm"}),),
        cache_chunks=(3, 4, 6, T),
    ),
    Family("mimo_v2", mtp="model.mtp.layers.0.", release_block=None, block="swa + dense", verified=False,
        handover=_BOTH,
        step_layers={"vllm": "first", "sglang": "cycle"},  # vLLM: n_predict 1; SGLang: one draft model per layer
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("mimo_v2_mtp.py", "_shard_fp8_qkv_proj"), "sglang": ("mimo_v2_nextn.py", "_filter_mtp_weights")},
        # translated config: 4 SWA kv heads (transformers: num_key_value_heads x 2), the release's epsilon
        module={"block:type": "MiMoV2FlashDecoderLayer", "block.self_attn.k_proj.weight:shape": (4 * 24, 64),
                "block.input_layernorm.variance_epsilon": 1e-6},
        reference=ref.mimo_v2,
        # the pre-sharded interleave, the window and the layer matter (the per-chunk scale grid:
        # test_mimo_v2_qkv_matches_vllms_read, where the chunks' scales differ more than random init makes them)
        wrong=({"interleaved": False}, {"window": False}, {"layer": 1}),
        stored=False, keys=ref.mimo_v2_keys(0), layers=3, fp8_weights=4,
        cache_chunks=(6, 7, 8, 9, T),
        versions={"vllm": "0.34.0"},
    ),
    # MiMo-V2.5-Pro's relation: as many SWA key-value heads as num_key_value_heads (one per chunk)
    Family("mimo_v2_pro", mtp="model.mtp.layers.0.", release_block=None, block="swa + dense", verified=False,
        spec="mimo_v2", handover=_BOTH, step_layers={"vllm": "first", "sglang": "cycle"},
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("mimo_v2_mtp.py", "_shard_fp8_qkv_proj"), "sglang": ("mimo_v2_nextn.py", "_filter_mtp_weights")},
        module={"block:type": "MiMoV2FlashDecoderLayer", "block.self_attn.k_proj.weight:shape": (2 * 24, 64),
                "block.self_attn.num_key_value_groups": 4},
        reference=ref.mimo_v2, wrong=({"interleaved": False}, {"window": False}, {"layer": 2}),
        stored=False, keys=ref.mimo_v2_keys(0), layers=3, fp8_weights=4,
        versions={"vllm": "0.34.0"},
    ),
    Family("glm5_next", mtp="model.language_model.layers.4.", release_block="model.language_model.layers.45.",
        block="mla_dsa + moe", verified=False,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        # both engines capture EAGLE-3 aux states of this target; no transfer fits (refuses_eagle3)
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("glm5next/common/mtp.py", "skip_rope", "SupportsEagle3"),
                 "sglang": ("glm5_next_nextn.py", "skip_rope", "set_eagle3_layers_to_capture")},
        aux_ids={"sglang": "plus_one"},
        # composed from transformers' attention and MoE (its decoder layer always mixes 4 hyper-connection streams)
        module={"block:type": "ComposedBlock", "block.self_attn:type": "Glm5NextTextAttention",
                "block.mlp:type": "Glm5NextTextMoE", "block.self_attn.indexer.index_kpool": 2, "rotary_emb": None},
        reference=ref.glm5_next_vllm,
        wrong=({"index_topk": T},),  # the indexer's k-pool selection is applied and matters
        refuses_eagle3="glm5_next has no EAGLE-3 conversion",
        release_tensors=889,
        experts="n_routed_experts",
        variants=("glm5_next_fp8",), variant_fp8_weights=31,  # the fewest: kv_b_proj and the indexer stay bf16
        fp8_dtypes={"self_attn.q_a_proj.weight": "F8_E4M3", "self_attn.kv_b_proj.weight": "",
                    "self_attn.indexer.wq_b.weight": "", "mlp.experts.0.up_proj.weight": "F8_E4M3",
                    "eh_proj.weight": ""},
        cache_chunks=(3, 4, 6, T),
        masked=True,
        nope=True,
        versions={"vllm": "0.34.0"},
    ),
    Family("qwen3_5_flat", mtp="mtp.", release_block="mtp.layers.0.", block="gated_gqa + dense", verified=False,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": True}, "sglang": {"mtp": True, "eagle3": True}},
        sources={"vllm": ("qwen3_5/nvidia/mtp.py", "qwen3_5_text"), "sglang": ("Qwen3_5ForCausalLMMTP", "qwen3_5_text.py")},
        aux_ids={"sglang": "plus_one"},
        module={**_QWEN3_5_MODULE, "block.mlp.gate_proj.weight:shape": (128, 64)},  # dense SwiGLU [I, H]
        reference=ref.qwen3_hybrid,
        wrong=({"norm": "standard"}, {"order": "hidden_embed"}, {"gate": False}),
        exact_keys=True,
        vllm_loads=ref.qwen3_5_dense_vllm_loads,
        keys_present=("model.layers.3.self_attn.q_proj.weight", "model.layers.0.linear_attn.A_log"),
        prefixes_absent=("model.language_model.", "model.visual.", "lm_head."),  # flat, no tower, head tied
        same_names=(("model.layers.3.",), ("mtp.layers.0.",)),  # the trunk's full-attention layer
        nextn="Qwen3_5ForCausalLMMTP",
        versions={"vllm": "0.34.0"},
    ),
    Family("hy_v4", mtp="model.mtp_layers.0.", release_block=None, block="mla_dsa + moe", verified=False,
        handover=_BOTH, step_layers=_CYCLE_FIRST,
        support={"vllm": {"mtp": True, "eagle3": False}, "sglang": {"mtp": True, "eagle3": False}},
        sources={"vllm": ("hy_v4/nvidia/mtp.py", "enable_ihc = False"),
                 "sglang": ("hunyuan_v4_nextn.py", "from_mtp_carry")},
        notes={"vllm": ("set_skip_topk",), "sglang": ("from_mtp_carry",)},
        # composed from transformers' attention and MoE (its decoder layer always mixes the hyper-connection streams)
        module={"block:type": "ComposedBlock", "block.self_attn:type": "HYV4Attention", "block.mlp:type": "HYV4MoE",
                "block.self_attn.sinks:dtype": torch.float32},
        reference=ref.hy_v4_vllm,
        # the indexer's selection and the attention sinks are applied and matter
        wrong=({"index_topk": T}, {"sinks": False}),
        refuses_eagle3="hy_v4 has no EAGLE-3 conversion",
        experts="n_routed_experts",
        stored=False, keys=ref.hy_v4_mtp_keys(),
        cache_chunks=(3, 4, 6, T),
        masked=True,
        versions={"vllm": "0.34.0"},
    ),
)
# fmt: on
