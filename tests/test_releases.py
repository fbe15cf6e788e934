"""Every release in the corpus (tests/data/releases: published config.json files, verbatim, sources cited) run end
to end: a tiny checkpoint built from the release's own config.json (sizes shrunk by `releases.shrink`, nothing else
touched; keys and dtypes as released, through the family's fixture builder), then inspect, convert (each draft kind
the family serves), distill, evaluate (lossless; a family whose trunk mtp2draft cannot run: distill's one-line
refusal, `TRUNK_REFUSED`), every export format of the draft's kind the family has, and
validate. The release's keys must reach each draft and each export unchanged: an engine reads them, not ours.

A new release is one folder in the corpus and, where its family's hub layout has several fixture rows (an FP8
release), one line in `LAYOUT`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.fixtures import FIXTURES, build_fixture, write_char_tokenizer
from support.releases import PER_LAYER, Release, releases, shrink

from mtp2draft.cli.app import main
from mtp2draft.conversion import refuse_eagle3
from mtp2draft.errors import Mtp2DraftError
from mtp2draft.evaluation.decode import LosslessError
from mtp2draft.family.spec import find_spec
from mtp2draft.kinds import DraftKind

REPO = Path(__file__).resolve().parents[1]
RELEASES = releases()
# release -> the fixture row whose hub layout it ships (trunk class, FP8 block quantisation, stored embed / head)
LAYOUT = {
    "deepseek_v3/DeepSeek-V3": "deepseek_v3_fp8",
    "deepseek_v32/DeepSeek-V3.2": "deepseek_v32_fp8",
    "deepseek_v4/DeepSeek-V4-Flash": "deepseek_v4_fp4",
    "deepseek_v4/DeepSeek-V4-Pro": "deepseek_v4_fp4",
    "glm_moe_dsa/GLM-5.1": "glm_moe_dsa",
    "glm_moe_dsa/GLM-5.2-FP8": "glm_moe_dsa_fp8",
    "qwen3_5_moe_text/Qwen3.5-397B-A17B": "qwen3_5_moe",
    "qwen3_5_text/Qwen3.5-27B": "qwen3_5",
}


# family -> why mtp2draft refuses to run its trunk (distill / evaluate), in the refusal's words: MiMo-V2 ships a fused
# `self_attn.qkv_proj` that transformers' mimo_v2_flash class reads as separate q / k / v, which would be random
TRUNK_REFUSED = {"mimo_v2": "mtp2draft cannot run this target's trunk yet"}

# release -> why its tiny target's own greedy output depends on how many tokens one forward holds, so speculative
# decoding (which verifies k + 1 tokens a forward) cannot be checked lossless against one-token-at-a-time greedy
# decoding. GLM-5.2 (indexer top-k 4 here, layers 3 and 4 sharing layer 2's selection): transformers'
# GlmMoeDsaIndexer picks each query's keys with torch.topk over ReLU'd index scores, and where scores tie at the
# k-th place (zeros) which keys it keeps changes with the number of keys in the forward; run with every key selected,
# the same target gives the same greedy output either way. Not a fault of the draft or of speculative decoding: the
# target itself parts from its greedy output (GLM-5.1's tiny target does too, on other prompts than these). evaluate
# raises its LosslessError there, naming that cause beside a bug; the test asserts it.
BATCH_VARIANT = {"glm_moe_dsa/GLM-5.2": "transformers' DSA indexer breaks top-k ties by sequence length"}


def _layout(release: Release) -> str:
    return LAYOUT.get(release.id, release.family)


def _run(argv: list[str], capsys) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, (argv[:2], err)
    return out


# short records (the tiny targets' character tokenizer spends a token per character): a chat with a system prompt
# and two turns, and a single-turn one; text where the release ships no chat template
CHATS = [
    [
        {"role": "system", "content": "Answer with code."},
        {"role": "user", "content": "Add a and b."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b\n"},
        {"role": "user", "content": "Now subtract."},
        {"role": "assistant", "content": "def sub(a, b):\n    return a - b\n"},
    ],
    [{"role": "user", "content": "Square x."}, {"role": "assistant", "content": "def sq(x):\n    return x * x\n"}],
]
TEXTS = ["def add(a, b):\n    return a + b\n", "def sq(x):\n    return x * x\n"]


def _data(root: Path, chats: bool) -> Path:
    path = root / "data.jsonl"
    records = [{"messages": c} for c in CHATS] if chats else [{"text": t} for t in TEXTS]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _target(release: Release, root: Path) -> tuple[Path, dict]:
    """The tiny checkpoint of `release`: its shrunk config.json, the family's hub layout, a character tokenizer
    carrying the release's chat template where one was found."""
    spec = find_spec(release.config())
    config = shrink(release.config(), spec.config.text_config)
    target = build_fixture(_layout(release), root / "target", config=config)
    write_char_tokenizer(target)
    template = release.chat_template()
    if template:
        tok = json.loads((target / "tokenizer_config.json").read_text())
        tok["chat_template"] = template
        (target / "tokenizer_config.json").write_text(json.dumps(tok))
        (target / "chat_template.jinja").unlink(missing_ok=True)
    return target, config


def _formats(spec, kind: DraftKind) -> list[str]:
    """The export formats of `kind` this family has (nextn where SGLang names a NextN architecture, speculators' mtp
    type where the spec gives one)."""
    if kind == DraftKind.EAGLE3:
        return ["sglang", "speculators"]
    return (
        ["stitched"]
        + (["nextn"] if spec.nextn.architecture else [])
        + (["speculators-mtp"] if spec.speculators.mtp_model_type else [])
    )


def _kinds(spec) -> list[DraftKind]:
    kinds = [DraftKind.MTP]
    try:
        refuse_eagle3(spec)
        kinds.append(DraftKind.EAGLE3)
    except Mtp2DraftError:
        pass
    return kinds


def test_the_corpus_cites_every_file() -> None:
    assert RELEASES, "no release in tests/data/releases"
    for release in RELEASES:
        sources = (release.path / "SOURCES.md").read_text()
        for f in release.path.iterdir():
            if f.name != "SOURCES.md":
                assert f.name in sources, f"{release.id}: {f.name} has no cited source"
        assert find_spec(release.config()).name == release.family, release.id
        assert _layout(release) in FIXTURES


def test_shrink_edits_sizes_only() -> None:
    """Every value `shrink` changes is a size: a smaller count or width, a per-layer list cut to the layer count (some
    of the release's layers in its order, one of each kind at least; the MTP layers' entries past the trunk kept), or
    the RoPE dict with only its mrope_section rescaled; every other key keeps its published value and type."""
    for release in RELEASES:
        published = release.config()
        tiny = shrink(published)
        assert list(tiny) == list(published)
        for key in (k for k in published if tiny[k] != published[k]):
            was, now = published[key], tiny[key]
            if isinstance(was, list):  # the release's layers, in order, fewer, every kind kept
                rest = iter(was)
                assert key in PER_LAYER and all(kind in rest for kind in now), (release.id, key)
                assert len(now) < len(was) and set(now) == set(was), (release.id, key)
            elif isinstance(was, dict):
                assert {k: v for k, v in now.items() if k != "mrope_section"} == {
                    k: v for k, v in was.items() if k != "mrope_section"
                }, (release.id, key)
                assert sum(now["mrope_section"]) < sum(was["mrope_section"]), (release.id, key)
            else:
                assert type(now) is type(was) is int and 0 <= now < was, (release.id, key)
        layers = published.get("num_hidden_layers")
        for key in (k for k in PER_LAYER if isinstance(published.get(k), list) and isinstance(layers, int)):
            past = len(published[key]) - layers  # the MTP layers' entries: kept, after the tiny trunk's
            assert len(tiny[key]) == tiny["num_hidden_layers"] + past, (release.id, key)
            assert tiny[key][len(tiny[key]) - past :] == published[key][layers:], (release.id, key)


@pytest.mark.parametrize("release", RELEASES, ids=[r.id for r in RELEASES])
def test_a_release_runs_end_to_end(release: Release, tmp_path: Path, capsys) -> None:
    spec = find_spec(release.config())
    target, config = _target(release, tmp_path)
    assert json.loads((target / "config.json").read_text()) == config  # the release's keys, as published
    info = json.loads(_run(["inspect", target, "--json"], capsys))
    assert info["spec"] == spec.name if "spec" in info else info
    data = _data(tmp_path, chats=release.chat_template() is not None)
    for kind in _kinds(spec):
        draft = tmp_path / f"draft-{kind}"
        # EAGLE-3: aux layers from 1 (the ids SGLang's eagle_config can name), the deepest three the tiny trunk has
        aux = ["--aux-layers", "1,2,3"] if kind == DraftKind.EAGLE3 else []
        _run(["convert", target, "--out", draft, "--to", kind, "--dtype", "float32", *aux], capsys)
        recorded = json.loads((draft / "config.json").read_text())
        recorded = recorded.get("target_config") or recorded["mtp2draft"]["target_config"]
        assert recorded == config, "the draft records the target's config.json as released"
        tuned = draft
        if kind == DraftKind.MTP and spec.name in TRUNK_REFUSED:  # one line, before any training
            code = main(
                [str(a) for a in ["distill", draft, "--target", target, "--data", data, "--out", tmp_path / "t"]]
            )
            err = capsys.readouterr().err
            assert code != 0 and TRUNK_REFUSED[spec.name] in err and "Traceback" not in err, err
            assert not (tmp_path / "t").exists()
        elif (
            kind == DraftKind.MTP
        ):  # the native draft through every stage; EAGLE-3 (same checks) converted and exported
            tuned = tmp_path / f"tuned-{kind}"
            _run(
                ["distill", draft, "--target", target, "--data", data, "--out", tuned, "--steps", 2, "--batch-size", 2,
                 "--max-length", 160, "--save-every", 1000, "--device", "cpu"],
                capsys,
            )  # fmt: skip
            evaluate = ["evaluate", tuned, "--target", target, "--data", data, "-k", 2, "--max-new-tokens", 6, "--json"]
            if release.id in BATCH_VARIANT:  # the lossless check cannot hold here; see BATCH_VARIANT
                with pytest.raises(LosslessError, match="no logit tie"):
                    _run(evaluate, capsys)
            else:
                report = json.loads(_run(evaluate, capsys))
                assert all(r["lossless"] for r in report["results"]), report["results"]
        for fmt in _formats(spec, kind):
            out = tmp_path / f"export-{fmt}"
            _run(["export", tuned, "--format", fmt, "--target", target, "--out", out], capsys)
            _run(["validate", out], capsys)
            if fmt == "stitched":  # the overlay is the target's checkpoint: its config.json, key for key
                stitched = json.loads((out / "config.json").read_text())
                assert {k: stitched.get(k) for k in config} == config
            shutil.rmtree(out)


def test_an_fp8_release_without_accelerate_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """transformers loads an FP8 release as a target only through accelerate (an optional extra): without it, one
    line naming the extra, not transformers' ImportError."""
    from transformers.quantizers import quantizer_finegrained_fp8

    from mtp2draft.errors import OptionError
    from mtp2draft.target.hidden import TargetModel

    target = build_fixture("deepseek_v3_fp8", tmp_path / "target")
    monkeypatch.setattr(quantizer_finegrained_fp8, "is_accelerate_available", lambda: False)
    with pytest.raises(OptionError, match=r"is quantised \(fp8\).*mtp2draft\[device-map\]"):
        TargetModel(str(target))


@pytest.mark.parametrize(
    "release", [r for r in RELEASES if r.chat_template()], ids=[r.id for r in RELEASES if r.chat_template()]
)
def test_chats_render_through_the_release_template(release: Release, tmp_path: Path) -> None:
    """`--data` chats (system prompt, two turns) through the release's own chat template: the ids `encode` builds
    turn by turn are transformers' apply_chat_template of the whole chat, and the loss covers each assistant reply."""
    from transformers import AutoTokenizer

    from mtp2draft.data import encode

    write_char_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    tok.chat_template = release.chat_template()
    for chat in CHATS:
        example = encode({"messages": chat}, tok, 10_000)
        whole = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=False)
        whole = whole["input_ids"] if hasattr(whole, "keys") else whole
        assert example.input_ids == list(whole)
        text = lambda ids: "".join(tok.convert_ids_to_tokens(ids))  # noqa: E731 (the char tokenizer: one token a char)
        trained = text([i for i, m in zip(example.input_ids, example.loss_mask, strict=True) if m])
        for message in chat:
            if message["role"] == "assistant":
                assert message["content"] in trained, (message["content"], trained)
        prompt = text(example.input_ids[: example.prompt_length])
        assert all(m["content"] not in trained for m in chat if m["role"] != "assistant")
        assert chat[0]["content"] in prompt
