"""Write in-domain distillation data: text records from the held-out packages' files that no evaluation prompt uses.

    python scripts/domain_data.py [--out examples/data/domain.jsonl] [--heldout examples/data/heldout.jsonl]

The bundled targets never trained on the held-out packages (huggingface_hub, _pytest, pytest:
`train_target.HELDOUT_PACKAGES`), and `heldout.jsonl`'s prompts come from the first files of those packages in
`train_target.corpus_files`' hash order (three prompts per file, 200 prompts). A user distils on text like the
traffic the draft will serve, not on what the target trained on; this is that data for the bundled targets: the
held-out packages' *other* files, cut into chunks of 1000-2000 characters as `train.jsonl` is (every chunk, where
`train.jsonl` keeps two per file: these files are few), so a draft can be distilled in the evaluation's domain
without seeing an evaluation file.

It rebuilds the held-out prompts with train_target's own functions and stops unless they equal the committed
`--heldout` file line for line (other installed package versions would give other files: then the split below would
not be the committed one's). The files behind those prompts are then left out: the prompts are the first 200 chunks
of the first files, so the files are those up to the one that gave the last prompt. It prints the counts (files
behind the prompts, files used, records) on stderr and writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_target as tt  # noqa: E402  (the corpus reader and chunkers the bundled data was written with)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = 200  # write_data's held-out prompt count


def split(heldout: list[tuple[str, str]], prompts: list[str]) -> tuple[int, list[tuple[str, str]]]:
    """(files behind the prompts, the held-out files after them). Raises SystemExit when the rebuilt prompts differ."""
    rebuilt, behind = [], 0
    for _, text in heldout:
        if len(rebuilt) >= PROMPTS:
            break
        rebuilt += tt.spread(tt.text_chunks(text, 400, 800), 3)
        behind += 1
    if rebuilt[:PROMPTS] != prompts:
        raise SystemExit(
            "the held-out prompts rebuilt from the installed packages differ from the committed file "
            "(other package versions?): not writing a split that could overlap them"
        )
    return behind, heldout[behind:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "examples/data/domain.jsonl")
    ap.add_argument("--heldout", type=Path, default=ROOT / "examples/data/heldout.jsonl")
    args = ap.parse_args(argv)
    prompts = [json.loads(line)["text"] for line in args.heldout.read_text().splitlines() if line.strip()]
    _, heldout, _ = tt.corpus_files(None)
    behind, rest = split(heldout, prompts)
    records = [c for _, text in rest for c in tt.text_chunks(text, 1000, 2000)]
    # no record may contain an evaluation prompt (a file can be a copy of another under a new name)
    records = [r for r in records if not any(p in r or r in p for p in prompts)]
    tmp = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        for text in records:
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    print(
        f"held-out files: {len(heldout)}; behind the {len(prompts)} prompts: {behind}; "
        f"used: {len(rest)}; records: {len(records)} -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
