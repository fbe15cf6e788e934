"""Hidden-state sources (mtp2draft/hidden.py): the frozen target's features (final hidden before/after the norm,
aux layers, logits), the same forward run incrementally over a KV cache, and the offline files round trip."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mtp2draft.errors import DataError
from mtp2draft.settings import DumpConfig
from mtp2draft.target.dumps import OfflineHiddenStates, dump_hidden_states, offline_features
from mtp2draft.target.hidden import Features, TargetModel


def test_target_parameters_are_frozen(target) -> None:
    tm = TargetModel(str(target("deepseek_v3")))
    assert not any(p.requires_grad for p in tm.model.parameters())
    assert not tm.model.training


def test_pre_norm_families_read_the_hidden_before_the_final_norm(target) -> None:
    tm = TargetModel(str(target("mimo")))  # MiMo: hidden taken before the final norm
    ids = torch.randint(0, 200, (1, 9))
    feats = tm.features(ids)
    post = tm.model(ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(tm._norm(feats.final), post, atol=1e-5)
    assert not torch.allclose(feats.final, post, atol=1e-3)
    tm2 = TargetModel(str(target("deepseek_v3")))  # DeepSeek: after
    post2 = tm2.model(ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(tm2.features(ids).final, post2, atol=1e-6)


def test_incremental_run_over_a_cache_equals_the_whole_sequence(target) -> None:
    """Decoding (evaluate) and training (distill) read the same forward: prefix + one token at a time over the KV
    cache gives the whole sequence's logits, final hidden and aux layers."""
    tm = TargetModel(str(target("deepseek_v3")))
    ids = torch.randint(0, tm.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    whole = tm.run(ids, aux_layers=[0, 1])
    cache, parts = tm.new_cache(), []
    for lo, hi in ((0, 5), (5, 6), (6, 9)):
        parts.append(tm.run(ids[:, lo:hi], aux_layers=[0, 1], cache=cache))
    for name in ("logits", "final", "aux"):
        got = torch.cat([getattr(p, name) for p in parts], dim=1)
        assert torch.allclose(got, getattr(whole, name), atol=1e-5), name
    assert whole.aux.shape == (1, 9, 2 * tm.hidden_size)


def test_step0_input_refuses_features_a_draft_does_not_read() -> None:
    x = torch.zeros(1, 2, 3)
    assert Features(final=x, aux=None).step0_input("mtp") is x
    with pytest.raises(DataError, match="do not hold what a eagle3 draft reads"):
        Features(final=x, aux=None).step0_input("eagle3")


def test_dumped_files_read_back_as_the_targets_features(target, tmp_path: Path) -> None:
    tm = TargetModel(str(target("deepseek_v3")))
    gen = torch.Generator().manual_seed(1)
    seqs = [{"input_ids": torch.randint(0, tm.vocab_size, (n,), generator=gen).tolist(), "loss_mask": [True] * n}
            for n in (7, 4, 6)]  # fmt: skip
    dump_hidden_states(tm, seqs, tmp_path / "d", DumpConfig(aux_layers=[1, 0], top_k=5, shard_size=2))
    store = OfflineHiddenStates(tmp_path / "d")
    assert len(store) == 3 and store.aux_layers == [1, 0] and len(store.manifest["shards"]) == 2
    assert torch.equal(store.lm_head(), tm.lm_head().float())
    batch, feats = offline_features(store, [2, 1], length=5)  # sequence 2 cut to 5, sequence 1 padded to 5
    assert batch["attention_mask"].tolist() == [[1] * 5, [1] * 4 + [0]]
    for row, n, t in ((0, 2, 5), (1, 1, 4)):
        ids = torch.tensor([seqs[n]["input_ids"]])
        want = tm.features(ids, aux_layers=[1, 0])
        assert batch["input_ids"][row, :t].tolist() == seqs[n]["input_ids"][:t]
        assert torch.equal(feats.final[row, :t], want.final[0, :t]) and torch.equal(feats.aux[row, :t], want.aux[0, :t])
        values, indices = torch.log_softmax(want.logits[0, :t], -1).topk(5)
        assert torch.equal(feats.topk_logprobs[row, :t], values) and torch.equal(feats.topk_ids[row, :t], indices)
    assert feats.topk_logprobs[1, 4].tolist() == [-math.inf] * 5 and not batch["loss_mask"][1, 4]


def test_dump_hidden_regenerate_dumps_the_targets_own_responses(target, text_data, tmp_path: Path, capsys) -> None:
    """`dump-hidden --regenerate` (transformers here; vLLM in tests/testing/test_engine_vllm.py): each dumped
    sequence is the data's prompt followed by the target's own greedy continuation, the loss on that only."""
    from mtp2draft.cli.app import main
    from mtp2draft.data import Regeneration, load_tokenizer, read_examples, regenerate

    tgt = target("mimo", num_hidden_layers=2)
    argv = ["dump-hidden", "--target", str(tgt), "--data", str(text_data), "--out", str(tmp_path / "d")]
    assert main([*argv, "--regenerate", "--max-length", "32", "--top-k", "4"]) == 0, capsys.readouterr().err
    tok = load_tokenizer(tgt)
    examples, _ = read_examples(text_data, tok, 32, False)
    want = regenerate(examples, TargetModel(str(tgt)), tok, Regeneration(16))
    store = OfflineHiddenStates(tmp_path / "d")
    assert len(store) == len(want) > 0
    for n, ex in enumerate(want):
        got = store.sequence(n)
        assert got["input_ids"].tolist() == ex.input_ids and got["loss_mask"].tolist() == ex.loss_mask
    assert any(w.input_ids != e.input_ids for w, e in zip(want, examples, strict=True))  # responses were replaced


def test_a_trunk_whose_final_norm_is_not_called_norm_loads(tmp_path: Path) -> None:
    """Nemotron-H's trunk keeps its final norm as `norm_f` (the spec's target_norm, backbone.norm_f): the target
    loads and applies that module, not a missing `norm`."""
    from support.fixtures import build_fixture

    model = TargetModel(str(build_fixture("nemotron_h", tmp_path / "target")))
    assert model._norm is model.model.get_decoder().norm_f


def test_a_time_step_limit_past_the_dtype_range_reads_as_no_limit(tmp_path: Path) -> None:
    """Nemotron-3 Ultra's config.json bounds Mamba-2's time step by [0.0, 1e308] (JSON has no Infinity), a bound fp32
    and bf16 cannot hold, which torch.clamp in transformers' PyTorch Mamba-2 path refuses: the target runs, and as
    the same trunk with no upper bound."""
    from support.fixtures import build_fixture

    ids = torch.tensor([[5, 9, 17, 3, 11, 7]])
    open_end = TargetModel(str(build_fixture("nemotron_h", tmp_path / "inf", time_step_limit=[0.0, math.inf])))
    released = TargetModel(str(build_fixture("nemotron_h", tmp_path / "1e308", time_step_limit=[0.0, 1e308])))
    assert released.raw_config["time_step_limit"] == [0.0, 1e308]  # the release's config as published
    want, got = open_end.run(ids), released.run(ids)
    assert torch.equal(got.final, want.final) and torch.equal(got.logits, want.logits)


def test_a_target_with_no_causal_lm_class_loads_as_its_image_text_to_text_class(target) -> None:
    """GLM-OCR's text model type (glm_ocr_text) has no causal-LM class in transformers: the trunk loads as the
    release's GlmOcrForConditionalGeneration, its decoder the text model, and runs on text alone."""
    tm = TargetModel(str(target("glm_ocr")))
    assert type(tm.model).__name__ == "GlmOcrForConditionalGeneration"
    assert len(tm._layers) == tm.num_layers and tm._norm is tm.model.get_decoder().norm
    ids = torch.randint(0, tm.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    feats = tm.features(ids)
    post = tm.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    assert feats.logits.shape == (1, 9, tm.vocab_size) and torch.allclose(feats.final, post, atol=1e-6)


def test_a_target_transformers_has_no_class_for_is_one_line(target) -> None:
    """Step-5-Preview (step3p5v): transformers has no causal-LM class for its text model type and no class at all for
    the release's: one line saying mtp2draft cannot run the trunk, not transformers' traceback."""
    from mtp2draft.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"no class that runs a step3p5v trunk.*cannot run this target's trunk"):
        TargetModel(str(target("step3p5v")))


@pytest.mark.parametrize("fixture", ["exaone4_5", "nemotron_h_omni", "nemotron_h_super_omni"])
def test_a_multimodal_release_runs_its_text_trunk_under_the_wrappers_names(tmp_path: Path, fixture: str) -> None:
    """A vision-language / omni release keeps its text trunk under `language_model.` (EXAONE 4.5's
    model.language_model.*, Nemotron-3 Omni's language_model.backbone.* and language_model.lm_head): the target
    loads it (without the key mapping every trunk weight was missing and the target was refused), reads the
    release's own embedding, final norm and head, and, for Nemotron, runs as the same trunk stored as the text
    release stores it."""
    import json

    from safetensors.torch import load_file, save_file
    from support.fixtures import build_fixture

    from mtp2draft.checkpoint.reader import open_checkpoint
    from mtp2draft.target.trunk_names import trunk_key_mapping

    path = build_fixture(fixture, tmp_path / "target")
    tm = TargetModel(str(path))
    assert trunk_key_mapping(tm.spec)  # the spec's target_* keys carry the wrapper's component
    weights = {}
    for file in sorted(set(open_checkpoint(str(path)).weight_map.values())):
        weights.update(load_file(str(path / file)))
    keys = tm.spec.keys
    for key, got in ((keys.target_embed, tm.embedding()), (keys.target_head, tm.lm_head()), (keys.target_norm, None)):
        got = tm._norm.weight if got is None else got
        assert torch.equal(got, weights[key].float()), key
    if fixture == "exaone4_5":
        return  # no text-only EXAONE 4.5 release to compare with (no spec: it is the multimodal one's trunk)
    flat = tmp_path / "flat"  # the text release's layout: nemotron_h's names, its config at the top level
    flat.mkdir()
    text = {k.removeprefix("language_model."): v for k, v in weights.items() if k.startswith("language_model.")}
    save_file(text, str(flat / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())["llm_config"]
    (flat / "config.json").write_text(json.dumps({**config, "architectures": ["NemotronHForCausalLM"]}))
    plain = TargetModel(str(flat))
    assert plain.spec.name == "nemotron_h" and not trunk_key_mapping(plain.spec)
    ids = torch.tensor([[5, 9, 17, 3, 11, 7]])
    want, got = plain.run(ids), tm.run(ids)
    assert torch.equal(got.final, want.final) and torch.equal(got.logits, want.logits)
