"""scripts/wide_data.py: the wide distillation data holds no package, file or evaluation prompt the targets saw."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import wide_data  # noqa: E402


def _lines(tag: str, n: int = 60) -> str:
    return "".join(f"value_{tag}_{i:03d} = compute('{tag}', {i})  # padding to sixty chars\n" for i in range(n))


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    files = {
        "newpkg/core.py": _lines("core"),
        "newpkg/sub/util.py": _lines("util"),
        "newpkg/copy.py": _lines("seen"),  # byte-identical to a file the targets' sources hold
        "newpkg/__pycache__/core.py": _lines("cache"),
        "knownpkg/mod.py": _lines("known"),  # a package the targets' sources have
        "pytest/x.py": _lines("heldout"),  # a held-out package: evaluation prompts come from it
        "single.py": _lines("single"),
        "pip/y.py": _lines("pip"),
        "thing-1.0.dist-info/z.py": _lines("dist"),
    }
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    return site


def test_only_packages_and_files_no_source_holds(tmp_path: Path) -> None:
    site = _site(tmp_path)
    digests = {hashlib.sha256(_lines("seen").encode()).hexdigest()}
    got = wide_data.unseen_records(site, {"knownpkg"}, digests, cap=10**9, per_file=50)
    assert set(got) == {"newpkg", "single"}
    text = "".join(r for rs in got.values() for r in rs)
    for tag in ("core", "util", "single"):
        assert f"value_{tag}_010" in text
    for tag in ("seen", "cache", "known", "heldout", "pip", "dist"):
        assert f"value_{tag}_" not in text


def test_cap_and_chunks_per_file(tmp_path: Path) -> None:
    site = _site(tmp_path)
    one = wide_data.unseen_records(site, set(), set(), cap=10**9, per_file=1)
    assert all(len(rs) == 1 for g, rs in one.items() if g == "single")
    assert len(one["newpkg"]) == 3  # core, util, copy: one chunk each
    # the cap is checked before each file: a package stops at the file that crosses it
    capped = wide_data.unseen_records(site, set(), set(), cap=1, per_file=50)
    assert len({r.split("_")[1] for r in capped["newpkg"]}) == 1
    assert all(1000 <= len(r) <= 2000 for rs in one.values() for r in rs)


def test_mix_drops_prompt_holders_and_duplicates_in_a_fixed_order() -> None:
    prompt = "def f():\n    return 1\n"
    records = ["a" * 1200, "before\n" + prompt + "after\n", "b" * 1100, "a" * 1200]
    out = wide_data.mix(records, [prompt])
    assert sorted(out) == sorted({"a" * 1200, "b" * 1100})
    assert out == wide_data.mix(list(reversed(records)), [prompt])


def test_main_writes_the_set_and_refuses_the_own_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path)
    monkeypatch.setattr(wide_data, "seen_sources", lambda: ({"knownpkg"}, set()))
    extra = tmp_path / "domain.jsonl"
    extra.write_text(json.dumps({"text": "x = 1\n" * 200}) + "\n")
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps({"text": "value_util_010 = compute('util', 10)"}) + "\n")
    out = tmp_path / "wide.jsonl"
    rc = wide_data.main([str(site), "--out", str(out), "--with", str(extra), "--heldout", str(heldout)])
    assert rc == 0
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    assert "x = 1\n" * 200 in texts
    assert not [t for t in texts if "value_util_010 " in t]  # the chunk holding the prompt is gone
    assert [t for t in texts if "value_core_" in t]
    assert capsys.readouterr().out.strip() == hashlib.sha256(out.read_bytes()).hexdigest()
    assert not list(tmp_path.glob(".wide.jsonl.*"))
    own = wide_data.tt.source_roots()[-1][1]
    with pytest.raises(SystemExit, match="own site-packages"):
        wide_data.main([str(own), "--out", str(tmp_path / "no.jsonl")])
    assert not (tmp_path / "no.jsonl").exists()


def test_exclude_drops_what_an_earlier_run_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = _site(tmp_path)
    monkeypatch.setattr(wide_data, "seen_sources", lambda: ({"knownpkg"}, set()))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps({"text": "not in any record"}) + "\n")
    first = tmp_path / "first.jsonl"
    assert wide_data.main([str(site), "--out", str(first), "--heldout", str(heldout), "--per-file", "2"]) == 0
    earlier = [json.loads(line)["text"] for line in first.read_text().splitlines()]
    assert len(earlier) > 3
    second = tmp_path / "second.jsonl"
    argv = [str(site), "--out", str(second), "--heldout", str(heldout), "--per-file", "4", "--with", str(first)]
    assert wide_data.main([*argv, "--exclude", f"{first}:3"]) == 0
    texts = [json.loads(line)["text"] for line in second.read_text().splitlines()]
    assert not set(texts) & set(earlier[:3])  # what the earlier run read is gone
    assert set(earlier[3:]) <= set(texts)  # what it left unread stays
    assert len(texts) > len(earlier) - 3  # and the chunks a larger --per-file adds join them
    assert wide_data.main([*argv, "--exclude", str(first)]) == 0  # no count: the whole file
    assert not set(json.loads(line)["text"] for line in second.read_text().splitlines()) & set(earlier)
