"""push and the model card, with the real huggingface_hub client against the loopback Hub: round trip, a second push
that re-sends no weights, branches, and every failure as one line with nothing uploaded."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, constants, metadata_load, snapshot_download

from mtp2draft.cli.app import main
from mtp2draft.conversion import convert
from mtp2draft.errors import HubError, ValidationError
from mtp2draft.formats.export import export, validate
from mtp2draft.hub import card as hub_module
from mtp2draft.hub.card import model_card
from mtp2draft.hub.upload import push
from mtp2draft.settings import HubAccess

pytestmark = [
    pytest.mark.hub,
    # The client itself PUTs LFS bytes with httpx2's deprecated `data=<file>`: not ours to fix.
    pytest.mark.filterwarnings("ignore:Use 'content=<...>' to upload raw bytes:DeprecationWarning"),
]

TARGET = "org/tiny-deepseek"  # a family both engines serve EAGLE-3 drafts for (launch lines for both)


def _evaluation(mal: float) -> dict:
    row = {"num_draft_tokens": 3, "tokens_drafted": 300, "tokens_accepted": 200, "lossless": True}
    return {
        "target": TARGET,
        "target_commit": "0" * 40,
        "data": "prompts.jsonl",
        "num_prompts": 20,
        "max_new_tokens": 64,
        "results": [
            {
                **row,
                "name": "draft",
                "draft": "d",
                "mean_acceptance_length": mal,
                "acceptance_per_position": [0.8, 0.6, 0.4],
            },  # fmt: skip
            {
                **row,
                "name": "baseline: raw MTP head",
                "draft": "b",
                "mean_acceptance_length": 1.9,
                "acceptance_per_position": [0.8, 0.1, 0.0],
            },  # fmt: skip
        ],
    }


@pytest.fixture
def draft(build, hub, tmp_path: Path) -> Path:
    """An sglang export of an EAGLE-3 draft converted from a hub-hosted target, with an evaluation.json."""
    hub.add_repo(TARGET, build("deepseek_v3", num_hidden_layers=6))
    convert(TARGET, tmp_path / "eagle3", to="eagle3")
    export(tmp_path / "eagle3", "sglang", tmp_path / "sglang")
    (tmp_path / "sglang" / "evaluation.json").write_text(json.dumps(_evaluation(2.8)))
    hub.reset_counters()
    return tmp_path / "sglang"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(p.relative_to(folder).as_posix().encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _lfs_puts(hub) -> list[dict]:
    return [r for r in hub.requests if r["method"] == "PUT" and r["path"].startswith("/__lfs/")]


def test_card_offers_no_launch_line_an_engine_cannot_run(build, hub, tmp_path: Path) -> None:
    """MiMo: SGLang has no EAGLE-3 aux capture and vLLM's MiMo trunk returns no aux states: an EAGLE-3 card for a
    MiMo target offers neither launch line and says why."""
    hub.add_repo("org/tiny-mimo", build("mimo", num_hidden_layers=6))
    convert("org/tiny-mimo", tmp_path / "e3", to="eagle3")
    export(tmp_path / "e3", "sglang", tmp_path / "sglang")
    text = str(model_card(tmp_path / "sglang"))
    assert "--speculative-algorithm EAGLE3" not in text and '"method": "eagle3"' not in text
    assert "sglang 0.5.23 cannot serve a EAGLE-3 draft for mimo targets" in text
    assert "vllm 0.33.0 cannot serve a EAGLE-3 draft for mimo targets" in text
    assert "prefer `mtp2draft convert --to mtp`" in text  # docs/notes/eagle3-from-mtp.md's recommendation


def test_push_downloads_back_as_a_valid_draft_with_a_parseable_card(draft: Path, hub, tmp_path: Path) -> None:
    before = _digest(draft)
    result = push(draft, "tester/tiny-eagle3")
    assert _digest(draft) == before and not (draft / "README.md").exists()  # the local directory is untouched
    assert (
        result.url == f"{hub.endpoint}/tester/tiny-eagle3"
        and result.commit == hub.commits("tester/tiny-eagle3")[0]["oid"]
    )
    snap = Path(snapshot_download("tester/tiny-eagle3", cache_dir=tmp_path / "fresh"))
    shipped = [p.name for p in draft.iterdir() if not p.name.startswith(".")]  # the marker stays home
    assert sorted(p.name for p in snap.iterdir()) == sorted([*shipped, "README.md"])
    assert validate(snap) == []
    card = ModelCard.load(snap / "README.md")
    assert card.data.base_model == TARGET and card.data.library_name == "mtp2draft"
    assert card.data.pipeline_tag == "text-generation"
    assert {"speculative-decoding", "eagle3", "sglang", "vllm", "mtp2draft"} <= set(card.data.tags)
    assert card.data.eval_results[0].metric_type == "mean_acceptance_length"
    assert card.data.eval_results[0].metric_value == 2.8
    meta = metadata_load(snap / "README.md")
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 2.8
    text = card.text
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path tester/tiny-eagle3" in text
    assert '"method": "eagle3", "model": "tester/tiny-eagle3", "num_speculative_tokens": 3' in text
    assert "| **this draft** | 3 | 2.80 |" in text and "| baseline: raw MTP head | 3 | 1.90 |" in text
    assert "- spec: deepseek_v3" in text and "target commit" in text  # provenance


def test_push_and_validate_tell_the_format_once(draft: Path, hub, monkeypatch, capsys) -> None:
    """push (its validation and its model card) and the validate command read config.json and tell the format
    once, through `read_draft_directory`."""
    from mtp2draft.formats import export as export_module

    told = []
    detect = export_module.detect_format
    monkeypatch.setattr(export_module, "detect_format", lambda cfg: told.append(detect(cfg)) or told[-1])
    push(draft, "tester/once")
    assert told == ["sglang"]
    assert main(["validate", str(draft)]) == 0 and "sglang" in capsys.readouterr().out
    assert told == ["sglang", "sglang"]
    assert main(["validate", str(draft), "--format", "sglang"]) == 0
    assert told == ["sglang", "sglang"]  # a named format is not detected


def test_second_push_is_a_new_commit_without_resending_the_weights(draft: Path, hub) -> None:
    first = push(draft, "tester/d")
    assert len(_lfs_puts(hub)) == 1  # model.safetensors, through LFS
    (draft / "evaluation.json").write_text(json.dumps(_evaluation(3.1)))  # the user re-evaluated the draft
    second = push(draft, "tester/d", commit_message="New evaluation")
    assert second.commit != first.commit and len(hub.commits("tester/d")) == 3  # create + 2 uploads
    latest = hub.commits("tester/d")[0]
    assert latest["title"] == "New evaluation" and latest["files"] == ["README.md", "evaluation.json"]
    assert len(_lfs_puts(hub)) == 1  # the unchanged weights were not sent again
    assert "value: 3.1" in hub.files("tester/d")["README.md"].decode()


def test_revision_creates_the_branch(draft: Path, hub) -> None:
    result = push(draft, "tester/d", hub=HubAccess(revision="v2"))
    assert result.url.endswith("/tester/d/tree/v2") and result.revision == "v2"
    assert "model.safetensors" in hub.files("tester/d", revision="v2")
    assert hub.files("tester/d") == {}  # main keeps only create_repo's empty commit


def test_cli_push_prints_the_url_and_the_commit(draft: Path, hub, capsys) -> None:
    code = main(["push", str(draft), "--repo-id", "tester/cli", "--private"])
    out, err = capsys.readouterr()
    commit = hub.commits("tester/cli")[0]["oid"]
    assert code == 0 and out.splitlines() == [
        f"{hub.endpoint}/tester/cli",
        f"commit {commit}  {hub.endpoint}/tester/cli/commit/{commit}",
    ]
    assert "uploading" in err


def _one_line_error(capsys, args: list[str], needle: str) -> None:
    code = main(args)
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_no_token_anywhere_uploads_nothing(draft: Path, hub, monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(HubError, match="hf auth login"):
        push(draft, "tester/d")
    _one_line_error(capsys, ["push", str(draft), "--repo-id", "tester/d"], "HF_TOKEN")
    assert hub.requests == []


def test_someone_elses_repo_is_a_clear_403(draft: Path, hub, capsys) -> None:
    hub.users["hf_other"] = "other"
    hub.add_repo("other/theirs", {"README.md": b"theirs\n"})
    hub.reset_counters()
    with pytest.raises(HubError, match=r"no write access to other/theirs \(403"):
        push(draft, "other/theirs")
    _one_line_error(capsys, ["push", str(draft), "--repo-id", "other/new-repo"], "no write access to other/new-repo")
    assert hub.files("other/theirs") == {"README.md": b"theirs\n"} and not _lfs_puts(hub)


def test_network_failures_are_one_line(draft: Path, hub, capsys) -> None:
    hub.fail_next = 1000  # every request answers 500
    _one_line_error(capsys, ["push", str(draft), "--repo-id", "tester/d"], "failed with 500")
    hub.fail_next = 0
    hub.stop()
    with pytest.raises(HubError, match="is unreachable: cannot connect"):
        push(draft, "tester/d")


def test_a_broken_draft_is_refused_before_any_request(draft: Path, hub, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(draft, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids")
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValidationError, match="mtp2draft validate"):
        push(broken, "tester/d")
    assert hub.requests == []


def test_cards_of_native_exports_carry_their_launch_lines(build, tmp_path: Path) -> None:
    target = build("deepseek_v3")
    convert(str(target), tmp_path / "mtp", to="mtp")
    prov = json.loads((tmp_path / "mtp" / "provenance.json").read_text())
    prov["distill"] = {"steps": 300, "ttt_steps": 3, "lr": 5e-4, "data": "chats.jsonl"}
    (tmp_path / "mtp" / "provenance.json").write_text(json.dumps(prov))
    export(tmp_path / "mtp", "nextn", tmp_path / "nextn")
    export(tmp_path / "mtp", "stitched", tmp_path / "stitched", target=str(target))
    nextn = model_card(tmp_path / "nextn", "me/ds-nextn", base_model="deepseek-ai/DeepSeek-V3")
    assert nextn.data.base_model == "deepseek-ai/DeepSeek-V3" and "mtp" in nextn.data.tags
    assert "--speculative-algorithm NEXTN --speculative-draft-model-path me/ds-nextn" in nextn.text
    assert "### Distillation" in nextn.text and "| ttt_steps | 3 |" in nextn.text
    assert nextn.data.eval_results is None  # nothing measured: no model-index
    assert "prefer `mtp2draft convert --to mtp`" not in nextn.text  # the advice is for EAGLE-3 cards only
    stitched = model_card(tmp_path / "stitched", "me/ds-stitched")
    assert stitched.data.base_model is None  # a local path is not a Hub repo id
    assert '"method": "mtp", "num_speculative_tokens": 3' in stitched.text
    assert "## Notes from the export" in stitched.text
    # the overlay lines: the local target copied, the Hub draft downloaded over it; the export README's own lines
    # (local paths) are not quoted, so the card gives one k and one way to lay the overlay
    assert (
        f"cp -rL {target} ./target-stitched && hf download me/ds-stitched --include '*.safetensors' --include"
        in stitched.text
    )
    assert "### Overlay it onto the target" not in stitched.text and "hf download ./" not in stitched.text
    assert stitched.text.count("num_speculative_tokens") == 1
    readme = (tmp_path / "stitched" / "README.md").read_text()  # the export's own: local lines, the same k
    assert f"cp -rL {target} ./target-stitched\ncp {tmp_path / 'stitched'}/*.safetensors" in readme
    assert '"method": "mtp", "num_speculative_tokens": 3' in readme


def test_card_says_a_bf16_difference_was_at_logit_ties_and_a_real_one_is_no() -> None:
    # evaluate raises on a greedy difference that is not at a logit tie, so lossless False with ties recorded means
    # every parted prompt parted at a tie: the card must not call that a loss (bf16 evaluations have 6-9 per 64)
    report = _evaluation(2.8)
    report["results"][0] |= {"lossless": False, "ties": 3}
    report["results"][1] |= {"lossless": False, "ties": 0}
    rows = hub_module._acceptance_table(report).splitlines()
    assert rows[2].endswith("| yes, 3 tie(s) |") and rows[3].endswith("| **no** |")
