"""io.py: output directories that appear complete or not at all and never replace what mtp2draft did not write,
JSON written without secrets, and the streaming safetensors writer (the same bytes a reader expects)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mtp2draft.errors import OutputExistsError
from mtp2draft.manifest import MARKER, is_ours, mark, write_json
from mtp2draft.outputs.directories import atomic_output_dir, check_output_dir
from mtp2draft.outputs.writer import SafetensorsWriter, save_tensors
from mtp2draft.redact import register_secret


# ---- check_output_dir --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("out", "overwrite", "why"),
    [
        ("in", False, "is the input"),
        ("in/sub", False, "lies inside the input"),
        (".", True, "contains the input"),
        ("file.txt", True, "exists and is a file"),
        ("full", False, "is not empty (pass --overwrite"),
        ("full", True, "holds files mtp2draft did not write"),
    ],
)
def test_outputs_that_would_destroy_something_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, overwrite: bool, why: str
) -> None:
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    (work / "full").mkdir()
    (work / "full" / "notes.txt").write_text("mine")
    (work / "file.txt").write_text("x")
    monkeypatch.chdir(tmp_path)  # the working directory is above every case's --out
    with pytest.raises(OutputExistsError, match=why.replace("(", r"\(")):
        check_output_dir(work / out, overwrite, inputs=[work / "in", "org/hub-id", None])
    assert (work / "full" / "notes.txt").read_text() == "mine"


def test_the_working_directory_is_never_an_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    for out in (".", ".."):
        with pytest.raises(OutputExistsError, match="working directory"):
            check_output_dir(out, overwrite=True)


def test_empty_new_and_marked_directories_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "model.safetensors").write_bytes(b"x")
    mark(tmp_path / "ours")
    assert is_ours(tmp_path / "ours") and not is_ours(tmp_path / "empty")
    for name in ("empty", "new/deeper"):
        assert check_output_dir(tmp_path / name, overwrite=False) == tmp_path / name
    assert check_output_dir(tmp_path / "ours", overwrite=True) == tmp_path / "ours"


# ---- atomic_output_dir -------------------------------------------------------------------------------------------
def test_a_failed_write_leaves_nothing_and_keeps_the_old_output(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with atomic_output_dir(tmp_path / "out") as tmp:
        (tmp / "a.json").write_text("1")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MARKER, "a.json"]
    with pytest.raises(RuntimeError, match="half way"), atomic_output_dir(tmp_path / "out", overwrite=True) as tmp:
        (tmp / "b.json").write_text("2")
        raise RuntimeError("half way")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary sibling left behind
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MARKER, "a.json"]
    with atomic_output_dir(tmp_path / "out", overwrite=True) as tmp:
        (tmp / "c.json").write_text("3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MARKER, "c.json"]


# ---- write_json --------------------------------------------------------------------------------------------------
def test_write_json_redacts_known_secrets_and_leaves_no_temporary(tmp_path: Path) -> None:
    secret = "hf_" + "Wm3p" * 9
    register_secret(secret)
    write_json(tmp_path / "p.json", {"command": f"convert --token {secret}", "path": tmp_path, "n": [1, 2]})
    text = (tmp_path / "p.json").read_text()
    assert secret not in text and text.endswith("}\n")
    assert json.loads(text) == {"command": "convert --token ***", "path": str(tmp_path), "n": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_the_token_hf_auth_login_stored_is_redacted_everywhere(tmp_path: Path, monkeypatch) -> None:
    """`hf auth login` writes the token to HF_TOKEN_PATH (huggingface_hub's `constants.HF_TOKEN_PATH`, which
    `get_token` reads when no variable is set). A stored token that is not shaped like `hf_...` (an org or OAuth
    token, a custom endpoint's) is only caught by its value: known, redacted in text, JSON and the stdout stream,
    found in upload bytes."""
    import io as text_io

    from huggingface_hub import constants

    from mtp2draft.redact import RedactedStream, find_secret, known_secrets, redact

    stored = "stored-login-Q7vX2mZk9pL4"  # no hf_ prefix: the shape rule cannot mask it
    (tmp_path / "token").write_text(stored + "\n")
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    assert stored in known_secrets()
    assert redact(f"pulled with {stored}.") == "pulled with ***."
    write_json(tmp_path / "p.json", {"source": f"https://u:{stored}@host/repo"})
    assert stored not in (tmp_path / "p.json").read_text() and "***" in (tmp_path / "p.json").read_text()
    out = text_io.StringIO()
    RedactedStream(out).write(f"token {stored}\n")
    assert out.getvalue() == "token ***\n"
    assert find_secret(f"x{stored}x".encode()) and not find_secret(b"nothing here")


def test_redact_masks_the_longest_secret_first() -> None:
    """One secret inside another (a token and the URL-style string holding it): the longer is masked whole, leaving
    no tail of it behind (masking the shorter first would leave `***-long`)."""
    from mtp2draft.redact import redact

    assert redact("x s3cret-value-long y", {"s3cret-value", "s3cret-value-long"}) == "x *** y"


def test_redact_helpers_use_the_secrets_they_are_given_and_register_only_strings() -> None:
    """scrub with an explicit set masks that set; register_secret ignores None, True (`--token` without a value) and
    strings too short to be secrets."""
    from mtp2draft.redact import known_secrets, register_secret, scrub

    given = "given-only-Zq81xw"
    assert given not in known_secrets()
    assert scrub({"a": [f"x {given}"]}, {given}) == {"a": ["x ***"]}
    before = known_secrets()
    for value in (None, True, "short"):
        register_secret(value)
    assert known_secrets() == before


# ---- the streaming safetensors writer ----------------------------------------------------------------------------
def test_streamed_file_reads_back_exactly_with_its_metadata(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(3, 5, generator=gen).to(torch.bfloat16),
        "b.scale": torch.randn(7, generator=gen),
        "c.fp8": torch.randn(2, 4, generator=gen).to(torch.float8_e4m3fn),
        "d.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, ::2],  # non-contiguous
        "e.empty": torch.zeros(0, 4),
    }
    save_tensors(tmp_path / "m.safetensors", tensors, {"format": "pt", "step": 3})
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}
        assert list(f.keys()) == list(tensors)
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), name


def test_writer_refuses_a_tensor_out_of_plan_and_a_short_file(tmp_path: Path) -> None:
    plan = [("x", torch.float32, (2,)), ("y", torch.float32, (3,))]
    refused = pytest.raises(RuntimeError, match=r"expected x torch.float32 \[2\], got y")
    with refused, SafetensorsWriter(tmp_path / "a.safetensors", plan) as writer:
        writer.write("y", torch.zeros(3))
    short = pytest.raises(RuntimeError, match="closed after 1 of 2 tensors")
    with short, SafetensorsWriter(tmp_path / "b.safetensors", plan) as writer:
        writer.write("x", torch.zeros(2))
