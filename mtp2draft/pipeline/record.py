"""What `run` records in its work directory so that a rerun of the same command continues where the last one stopped.

The record (`RECORD` inside `--work`) holds the run's identity (its inputs and every stage's settings, as given) and
the stages it finished, in order. A rerun with the same `--work`: the same identity continues after the last finished
stage; another identity is refused in one line naming `--work` and what differs; `--overwrite` starts afresh.

What counts as the same inputs: a local checkpoint or data file is fingerprinted (a checkpoint by its files' names,
sizes and modification times; a data file by its bytes' SHA-256), a Hub repo by its id and the revision given. What
does not count: `--push` and `--private` (they only steer the last stage, which a rerun with another repo redoes),
`--overwrite`, and the token (never written).

What this module does not do: run a stage, or decide which stage's output a finished stage left (`pipeline` does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from mtp2draft.errors import OutputExistsError
from mtp2draft.manifest import write_json

RECORD = ".mtp2draft-run.json"
STAGES = ("convert", "distill", "evaluate", "export", "push")
# RunConfig fields that are not the run's identity: where it works, whether it may replace that, and where it publishes
_NOT_IDENTITY = {"work", "overwrite", "push", "private", "training"}
_CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.py", "*.jinja")


def fingerprint(given: str | Path | None) -> Any:
    """What identifies an input as `run` read it: None, a Hub id (as given: no file to read), a file's SHA-256, or a
    directory's (name, size, mtime) per checkpoint file."""
    if given is None:
        return None
    path = Path(str(given)).expanduser()
    if path.is_file():
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return {"path": str(given), "sha256": digest.hexdigest()}
    if path.is_dir():
        files = sorted({p for pattern in _CHECKPOINT_FILES for p in path.rglob(pattern) if p.is_file()})
        return {"path": str(given), "files": [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns]
                                              for p in files]}  # fmt: skip
    return {"hub": str(given)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value if value is None or isinstance(value, bool | int | float | str) else repr(value)


def identity(source: str, config: Any, stages: dict[str, Any], placement: Any, revision: str | None) -> dict:
    """The run's identity: its inputs fingerprinted and every setting that changes what a stage writes."""
    training = config.training
    run_settings = {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    for name in _NOT_IDENTITY:
        run_settings.pop(name, None)
    for name in ("target", "eval_data"):
        run_settings[name] = fingerprint(getattr(config, name))
    data = {f.name: _plain(getattr(training, f.name)) for f in dataclasses.fields(training)}
    for name in ("data", "heldout", "hidden_states"):
        if name in data:
            data[name] = fingerprint(getattr(training, name))
    return {
        "source": fingerprint(source),
        "revision": revision,
        "run": run_settings,
        "training": data,
        "placement": _plain(placement),
        **{name: _plain(value) for name, value in stages.items()},
    }


def read(work: Path) -> dict | None:
    """The record in `work`, or None when there is none (or it is unreadable: then the run cannot be continued)."""
    try:
        record = json.loads((work / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("identity"), dict)
    return record if ok and isinstance(record.get("finished"), dict) else None


def differences(recorded: dict, now: dict, prefix: str = "") -> list[str]:
    """The dotted names of the settings and inputs that differ between two identities."""
    out = []
    for key in sorted(set(recorded) | set(now)):
        a, b = recorded.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and "path" not in a and "hub" not in a:
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(prefix + key)
    return out


def check_resumable(work: Path, now: dict) -> dict | None:
    """The stages a rerun into non-empty `work` may keep ({stage: what it recorded}), or a one-line refusal naming
    --work when `work` holds no run record or one of other inputs or settings. None when `work` is empty or absent."""
    if not work.is_dir() or not any(work.iterdir()):
        return None
    record = read(work)
    if record is None:
        raise OutputExistsError(
            f"--work {work} exists and holds no run to continue (pass --overwrite to replace it, or another --work)"
        )
    changed = differences(record["identity"], now)
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise OutputExistsError(
            f"--work {work} holds a run of other inputs or settings ({shown} differ): rerun its own command to "
            "continue it, pass --overwrite to start afresh, or choose another --work"
        )
    return record["finished"]


def begin(work: Path, now: dict, finished: dict | None) -> dict:
    """Write the record for a run that starts (or continues with `finished`); returns the finished stages."""
    finished = dict(finished or {})
    write_json(work / RECORD, {"identity": now, "finished": finished})
    return finished


def finish(work: Path, now: dict, finished: dict, stage: str, result: dict | None = None) -> None:
    """Record `stage` as finished (with what a rerun needs of it, e.g. the push's URL), after its output is in place."""
    finished[stage] = result or {}
    write_json(work / RECORD, {"identity": now, "finished": finished})
