"""Write wide distillation data: Python from packages the bundled targets never saw, mixed with the in-domain records.

    python scripts/wide_data.py SITE_PACKAGES --out WORK/wide.jsonl [--with examples/data/domain.jsonl]
        [--cap 1000000] [--per-file 4] [--exclude EARLIER.jsonl[:N]]

The bundled targets trained on the standard library and this interpreter's site-packages (`train_target.corpus_files`),
so a second environment's site-packages (the vLLM venv `mtp2draft engine install vllm` builds holds some 130 packages this one
does not) is Python no target has seen, as the held-out packages are. A draft distilled on 2310 in-domain records
(`domain.jsonl`) reaches 0.95 top-1 on them and 0.80 on the evaluation's prompts: it learns the records, not the
target. This writes more of what a user has, text like the traffic the draft will serve, so one pass of a long run sees
each record once.

Kept: every `*.py` of SITE_PACKAGES whose top-level package is absent from this interpreter's corpus sources (the
stdlib's modules and site-packages' packages, whatever the cap took of them) and is not a held-out package, and whose
content is byte-identical to no file of those sources (vendored copies). Each package gives at most `--cap` characters
of records (files in train_target's hash order, so no one package fills the set), each file up to `--per-file` chunks
of 1000-2000 characters spread over it (`train_target.spread`). Records holding an evaluation prompt
(`examples/data/heldout.jsonl`) are dropped. `--with` files' records are interleaved, and the whole set is written in a
fixed hash order of its texts (distill reads the first steps x batch records of a file). `--exclude FILE:N` drops the
first N records of FILE (all of them without `:N`): a second pass written this way, with a larger cap and the earlier
set mixed in `--with`, holds the earlier set's unread records and the files its cap left out, none of what the earlier
run read. It prints the counts per
package on stderr, the output's sha256 on stdout, and writes nothing else. The output is not committed (some 20 MB,
and it depends on that venv's versions): the sha256 in docs/benchmarks.md names the set a figure used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_target as tt  # noqa: E402  (the corpus sources, hash order and chunkers the targets were trained with)

ROOT = Path(__file__).resolve().parents[1]


def seen_sources() -> tuple[set[str], set[str]]:
    """(top-level names, content sha256s) of every *.py in this interpreter's corpus sources: what the targets could
    have trained on (more than they did: the cap took part of each package)."""
    names, digests = set(), set()
    for _, root in tt.source_roots():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if "__pycache__" in rel.split("/") or not path.is_file():
                continue
            names.add(tt.package_of(rel))
            try:
                digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
            except OSError:
                continue
    return names, digests


def unseen_records(site: Path, seen: set[str], digests: set[str], cap: int, per_file: int) -> dict[str, list[str]]:
    """{package: records} of the packages of `site` no corpus source has, in hash order, each within `cap`."""
    files: list[tuple[str, str, Path]] = []
    for path in site.rglob("*.py"):
        rel = path.relative_to(site).as_posix()
        group = tt.package_of(rel)
        if (
            "__pycache__" in rel.split("/")
            or group in seen
            or group in tt.HELDOUT_PACKAGES
            or group in tt.SKIP_PACKAGES
            or group.startswith("__editable__")
            or group.endswith((".dist-info", ".data"))
            or not path.is_file()
        ):
            continue
        files.append((group, rel, path))
    files.sort(key=lambda f: (tt.path_hash(f[1]), f[1]))
    digests = set(digests)  # this site's own files join it (a second copy is skipped); the caller's set is left as is
    out: dict[str, list[str]] = {}
    used: dict[str, int] = {}
    for group, _, path in files:
        if used.get(group, 0) >= cap:
            continue
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if not text.strip() or digest in digests:
            continue
        digests.add(digest)
        for chunk in tt.spread(tt.text_chunks(text, 1000, 2000), per_file):
            out.setdefault(group, []).append(chunk)
            used[group] = used.get(group, 0) + len(chunk)
    return out


def mix(records: list[str], prompts: list[str]) -> list[str]:
    """The records without any that holds (or is inside) an evaluation prompt, duplicates dropped, in the fixed hash
    order of their texts."""
    kept = {r for r in records if not any(p in r or r in p for p in prompts)}
    return sorted(kept, key=lambda r: hashlib.sha256(r.encode()).hexdigest())


def excluded(spec: str) -> set[str]:
    """The texts `--exclude FILE[:N]` names: FILE's first N records (all without `:N`)."""
    path, _, count = spec.rpartition(":")
    if not count.isdigit():  # no ":N": the whole file
        path, count = spec, ""
    texts = [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]
    return set(texts[: int(count)] if count else texts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site_packages", type=Path, help="another environment's site-packages")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--with", dest="also", type=Path, action="append", default=[], help="JSONL text records to mix in")
    ap.add_argument("--heldout", type=Path, default=ROOT / "examples/data/heldout.jsonl")
    ap.add_argument("--cap", type=int, default=1_000_000, help="characters of records per package")
    ap.add_argument("--per-file", type=int, default=4, help="chunks per file")
    ap.add_argument(
        "--exclude", action="append", default=[], metavar="FILE[:N]", help="drop FILE's records (its first N)"
    )
    args = ap.parse_args(argv)
    site = args.site_packages.resolve()
    if not site.is_dir():
        raise SystemExit(f"not a directory: {site}")
    if any(site == root.resolve() for _, root in tt.source_roots()):
        raise SystemExit(f"{site} is this interpreter's own site-packages: the targets trained on it")
    prompts = [json.loads(line)["text"] for line in args.heldout.read_text().splitlines() if line.strip()]
    seen, digests = seen_sources()
    per_package = unseen_records(site, seen, digests, args.cap, args.per_file)
    records = [r for rs in per_package.values() for r in rs]
    for path in args.also:
        records += [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    drop = set().union(*map(excluded, args.exclude))
    records = mix([r for r in records if r not in drop], prompts)
    tmp = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        for text in records:
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    for group, rs in sorted(per_package.items(), key=lambda kv: -len(kv[1])):
        print(f"{group}: {len(rs)} records, {sum(map(len, rs))} chars", file=sys.stderr)
    print(
        f"packages: {len(per_package)}; unseen records: {sum(map(len, per_package.values()))}; "
        f"with {len(args.also)} file(s) mixed in: {len(records)} -> {args.out}",
        file=sys.stderr,
    )
    print(hashlib.sha256(args.out.read_bytes()).hexdigest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
