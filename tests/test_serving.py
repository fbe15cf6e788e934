"""The lines a stitched export's README and its model card print run as a user runs them, from one directory: the
overlay lands on a copy of the target, and the README, the card and `run`'s summary give one k."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtp2draft.conversion import convert
from mtp2draft.family.spec import get_spec
from mtp2draft.formats.export import export, validate
from mtp2draft.formats.serving import launch_lines


def _bash_blocks(markdown: str, after: str) -> list[str]:
    """The bash blocks of `markdown` that follow the line `after` (a heading or a label)."""
    text = markdown[markdown.index(after) :]
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def _run_lines(block: str, cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # the venv's `hf`
    for line in block.splitlines():
        done = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, env=env)
        assert done.returncode == 0, f"{line}\n{done.stderr}"


def _overlaid(where: Path, overlay: Path) -> None:
    """`where` holds the target with the overlay's shards, index and config laid over it, and the view vLLM needs."""
    for file in overlay.glob("*.safetensors"):
        assert (where / file.name).read_bytes() == file.read_bytes(), file.name
    config = (where / "config.json").read_text()
    for field, value in get_spec("mimo").engine("vllm").config_view.items():
        assert f'"{field}": "{value}"' in config


def test_the_readme_overlay_lines_run_from_the_export_directory(target, tmp_path, monkeypatch) -> None:
    source = target("mimo", num_hidden_layers=4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-mimo").symlink_to(source)  # a relative local target, as a user types it
    convert("tiny-mimo", Path("mtp"), to="mtp")
    export(Path("mtp"), "stitched", Path("out/stitched"), target="tiny-mimo")
    readme = (tmp_path / "out" / "stitched" / "README.md").read_text()
    overlay = _bash_blocks(readme, "## Overlay it onto the target")[0]
    assert "hf download" not in overlay  # both are local: copied, never `hf download ./dir`
    _run_lines(overlay, tmp_path)
    _overlaid(tmp_path / "target-stitched", tmp_path / "out" / "stitched")
    # validate tells the overlaid target and the overlay from the target as released (a forgotten overlay copy)
    assert validate(tmp_path / "target-stitched", "stitched") == []
    assert validate(tmp_path / "out" / "stitched", "stitched") == []
    (untouched,) = validate(source, "stitched")
    assert "this is the untouched target" in untouched
    served = _bash_blocks(readme, "## Serve")
    assert any('"num_speculative_tokens": 3' in b for b in served)
    assert "Note: sglang 0.5.23 computes this family's MTP layer differently" in readme  # run's warning, by SGLang


@pytest.mark.hub
def test_the_card_overlay_lines_fetch_the_pushed_draft(target, hub, tmp_path, monkeypatch) -> None:
    from mtp2draft.hub.upload import push

    source = target("mimo", num_hidden_layers=4)
    hub.add_repo("org/tiny-mimo", source)
    convert("org/tiny-mimo", tmp_path / "mtp", to="mtp")
    export(tmp_path / "mtp", "stitched", tmp_path / "stitched", target="org/tiny-mimo")
    push(tmp_path / "stitched", "tester/tiny-mimo-stitched")
    card = hub.files("tester/tiny-mimo-stitched")["README.md"].decode()
    overlay = _bash_blocks(card, "overlay:")[0]
    assert overlay.startswith("hf download org/tiny-mimo --revision ")  # the commit the draft was made from
    assert "cp " not in overlay and str(tmp_path) not in card.split("## Provenance")[0]
    users = tmp_path / "user"
    users.mkdir()
    _run_lines(overlay.replace(" && ", "\n"), users)
    _overlaid(users / "target-stitched", tmp_path / "stitched")
    assert card.count("num_speculative_tokens") == 1


def test_k_is_one_number_in_every_line() -> None:
    from mtp2draft.family.spec import get_spec

    lines = launch_lines("stitched", "org/mimo", "me/d", 4, get_spec("mimo"))
    assert '"num_speculative_tokens": 4' in lines["vLLM"]
    assert "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5" in lines["SGLang"]


def test_push_dry_run_prints_the_card_and_uploads_nothing(target, tmp_path, monkeypatch, capsys) -> None:
    from mtp2draft.cli.app import main
    from mtp2draft.hub.card import model_card

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may reach a Hub: a dry run needs no token and no network
    source = target("mimo", num_hidden_layers=4)
    convert(str(source), tmp_path / "mtp", to="mtp")
    export(tmp_path / "mtp", "stitched", tmp_path / "stitched", target=str(source))
    argv = ["push", str(tmp_path / "stitched"), "--repo-id", "me/tiny-mimo-stitched", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == str(model_card(tmp_path / "stitched", "me/tiny-mimo-stitched"))
    assert "hf download me/tiny-mimo-stitched --include" in out
    (tmp_path / "stitched" / "config.json").write_text("{}")  # an invalid draft is refused as push refuses it
    assert main(argv) == 2


def test_evaluate_in_vllm_says_it_serves_mimo_under_another_config_view(target, tmp_path) -> None:
    """`evaluate --engine vllm` lays the draft over a view of the target; for MiMo that view's config says another
    model_type, and the run says so (it used to do it silently), as the card's overlay lines do."""
    import json

    from mtp2draft.engines.vllm_evaluate import serve_runs
    from mtp2draft.kinds import DraftKind

    source = target("mimo", num_hidden_layers=4)
    convert(str(source), tmp_path / "mtp", to="mtp")
    said: list[str] = []
    drafts = [("raw", str(tmp_path / "mtp"))]
    runs = serve_runs(drafts, {"raw": DraftKind.MTP}, source, tmp_path / "work", 2, "float32", progress=said.append)
    assert json.loads((runs[1].model / "config.json").read_text())["model_type"] == "qwen2"
    assert any("vLLM serves a view of the target whose config.json says model_type: qwen2" in s for s in said), said
