#!/usr/bin/env python3
"""Fetch, here, the Python packages `scripts/bench_gpu.sh` needs on the GPU machine and its image lacks; write them
into one folder (default `.whl/`, git-ignored) to copy to the GPU machine beside the checkout.

The GPU image holds torch 2.11, transformers 5.17, huggingface_hub 1.33, tokenizers 0.23, safetensors 0.8 and no
vLLM; mtp2draft needs transformers >= 5.24 and typer < 0.30 (typer 0.29 parses options with pydantic). So: the wheels
of WHEELS (pure Python, except pydantic_core and regex: CPython 3.12, manylinux x86-64, as the image's python3), and
transformers as a zip of its wheel without the model families mtp2draft never loads (their folders are 11 of its
13 MB, and the checkout plus this folder is what gets copied): every family a spec names, llama
(EAGLE-3) and the models those import are kept. `bench_gpu.sh` installs the wheels with pip (no index, no deps) and
unpacks the zip, into /tmp/site.

Usage: `python scripts/gpu_wheels.py [--out .whl]` (needs pip and a package index; run where those work).
What it does not do: install anything here, or fetch torch (the image's CUDA build is used).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSFORMERS = "transformers==5.24.0"
WHEELS = [
    "typer==0.29.2",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "regex==2026.11.19",  # transformers 5.24 needs >= 2025.10.22; the image's is not known
]
PLATFORM = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
ALWAYS = {"auto", "llama"}  # the auto classes; EAGLE-3 drafts are Llama layers


def download(names: list[str], dest: Path) -> None:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version"]
    args += ["3.12", "--implementation", "cp", *sum((["--platform", p] for p in PLATFORM), []), "-d", str(dest)]
    subprocess.run([*args, *names], check=True)


def spec_model_dirs() -> set[str]:
    """transformers model folders the specs' blocks live in (`[block] module`, else the model type's folder)."""
    dirs = set()
    for path in sorted((ROOT / "model_specs").glob("*.toml")):
        spec = tomllib.loads(path.read_text())
        module = spec.get("block", {}).get("module", "")
        match = re.match(r"transformers\.models\.(\w+)", module)
        dirs |= {match.group(1)} if match else set()
        dirs.add(spec["config"]["transformers_model_type"])  # its config class (kept where a folder has the name)
    return dirs


def slim_transformers(wheel: Path, out: Path) -> tuple[set[str], int]:
    """Copy `wheel` into the zip `out` without the model folders nothing kept imports; (kept folders, bytes)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        present = {n.split("/")[2] for n in names if n.startswith("transformers/models/") and n.count("/") >= 3}
        keep = {d for d in spec_model_dirs() | ALWAYS if d in present}
        # the closure: `from ..other.modeling_other import ...` inside kept folders
        todo = list(keep)
        while todo:
            folder = todo.pop()
            for n in names:
                if n.startswith(f"transformers/models/{folder}/") and n.endswith(".py"):
                    text = z.read(n).decode()
                    for other in re.findall(r"from \.\.(\w+)[. ]", text) + re.findall(r"models\.(\w+)", text):
                        if other in present and other not in keep:
                            keep.add(other)
                            todo.append(other)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            for n in names:
                parts = n.split("/")
                if n.startswith("transformers/models/") and len(parts) >= 4 and parts[2] not in keep:
                    continue
                dst.writestr(z.getinfo(n), z.read(n))
    return keep, out.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".whl")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("*.whl"), *args.out.glob("*.zip")]:
        old.unlink()  # one version of each: two stop the install there
    download(WHEELS, args.out)
    with tempfile.TemporaryDirectory() as tmp:
        download([TRANSFORMERS], Path(tmp))
        wheel = next(Path(tmp).glob("transformers-*.whl"))
        keep, size = slim_transformers(wheel, args.out / (wheel.stem + "-slim.zip"))
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"transformers without unused model folders: {size / 2**20:.1f} MiB (kept {', '.join(sorted(keep))})")
    print(f"{args.out}: {len(list(args.out.iterdir()))} files, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
