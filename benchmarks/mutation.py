"""Mutation testing of the core modules: how many small wrong changes to the code their tests let through.

For each core module, cosmic-ray (PyPI `cosmic-ray`, a development tool, not a dependency of mtp2draft) plants one
mutation at a time (an operator, a constant, a comparison, a removed statement), runs that module's test files, and
restores the file. A mutant the tests pass is a survivor: either a gap in the tests or a change that is not a bug
(an equivalent mutant). The script prints the survival rate per module and writes each module's survivors to
`<work>/<module>.survivors.txt` for review.

    pip install cosmic-ray                      # once, into the venv that runs the tests
    python benchmarks/mutation.py                # every module below (hours on a laptop CPU)
    python benchmarks/mutation.py compare redact # the named ones only

Run it on a clean checkout: cosmic-ray edits the module in place while a mutant's tests run (and restores it). The
per-module test selection keeps the run affordable; docs/testing.md records the rates measured and the survivors
accepted, with why.

What this does not do: judge a survivor (read them), or run the engine tests (`-m engine`).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (module path, the test files (and -k selection) that guard it)
MODULES: dict[str, tuple[str, str]] = {
    "compare": ("mtp2draft/evaluation/compare.py", "tests/test_evaluate.py -k bootstrap"),
    "redact": (
        "mtp2draft/redact.py",
        "tests/test_io.py tests/test_safety.py tests/test_cli.py -k 'redact or secret or token or command_line'",
    ),
    "fp8": ("mtp2draft/checkpoint/fp8.py", "tests/test_checkpoint.py tests/test_quant_formats.py"),
    "fp4": ("mtp2draft/checkpoint/fp4.py", "tests/test_quant_formats.py"),
    "sampling": ("mtp2draft/evaluation/sampling.py", "tests/test_sampling.py"),
    "ttt": ("mtp2draft/train/ttt.py", "tests/test_ttt.py"),
    "decode": ("mtp2draft/evaluation/decode.py", "tests/test_evaluate.py tests/test_target_placement.py"),
    "stitched": ("mtp2draft/formats/stitched.py", "tests/test_export.py -k stitched"),
}


def config(module: str, tests: str, timeout: float) -> str:
    """A cosmic-ray config (TOML; JSON strings are valid TOML basic strings)."""
    command = f"{sys.executable} -m pytest -x -q -p no:cacheprovider {tests}"
    return (
        f"[cosmic-ray]\nmodule-path = {json.dumps(module)}\ntimeout = {timeout}\nexcluded-modules = []\n"
        f'test-command = {json.dumps(command)}\n\n[cosmic-ray.distributor]\nname = "local"\n'
    )


def survivors(session: Path) -> tuple[int, int, list[str]]:
    """(mutants run, survivors, one line per survivor: file:line operator) from a cosmic-ray session."""
    db = sqlite3.connect(session)
    rows = db.execute(
        "SELECT m.module_path, m.start_pos_row, m.operator_name, m.occurrence, r.test_outcome "
        "FROM mutation_specs m JOIN work_results r ON m.job_id = r.job_id"
    ).fetchall()
    db.close()
    alive = [f"{path}:{row} {op} #{occ}" for path, row, op, occ, outcome in rows if str(outcome).lower() == "survived"]
    return len(rows), len(alive), sorted(alive)


def keep_sample(session: Path, size: int, seed: int = 0) -> int:
    """Keep a seeded random `size` of the session's mutants (all when fewer): (the number there were)."""
    db = sqlite3.connect(session)
    jobs = [r[0] for r in db.execute("SELECT job_id FROM mutation_specs ORDER BY job_id")]
    drop = [j for j in jobs if j not in set(random.Random(seed).sample(jobs, min(size, len(jobs))))]
    for table in ("mutation_specs", "work_items"):
        db.executemany(f"DELETE FROM {table} WHERE job_id = ?", [(j,) for j in drop])
    db.commit()
    db.close()
    return len(jobs)


def run(name: str, work: Path, timeout: float, sample: int | None) -> tuple[int, int, int]:
    module, tests = MODULES[name]
    cfg, session = work / f"{name}.toml", work / f"{name}.sqlite"
    cfg.write_text(config(module, tests, timeout))
    session.unlink(missing_ok=True)
    cosmic = [shutil.which("cosmic-ray") or str(Path(sys.executable).with_name("cosmic-ray"))]
    subprocess.run([*cosmic, "init", str(cfg), str(session)], cwd=ROOT, check=True)
    generated = keep_sample(session, sample) if sample else 0
    subprocess.run([*cosmic, "exec", str(cfg), str(session)], cwd=ROOT, check=True)
    total, alive, lines = survivors(session)
    (work / f"{name}.survivors.txt").write_text("\n".join(lines) + "\n")
    return generated or total, total, alive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".mutation-work")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run")
    parser.add_argument("--sample", type=int, help="run a seeded random N of each module's mutants (default: all)")
    args = parser.parse_args()
    if not shutil.which("cosmic-ray") and not Path(sys.executable).with_name("cosmic-ray").exists():
        sys.exit("error: cosmic-ray is not installed: pip install cosmic-ray")
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        sys.exit(f"error: unknown module {unknown[0]}; choose from {', '.join(MODULES)}")
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"{'module':<10} {'mutants':>8} {'run':>5} {'survived':>9} {'rate':>7}")
    for name in args.modules or list(MODULES):
        generated, total, alive = run(name, args.work, args.timeout, args.sample)
        rate = alive / total if total else 0.0
        print(f"{name:<10} {generated:>8} {total:>5} {alive:>9} {rate:>7.1%}", flush=True)


if __name__ == "__main__":
    main()
