"""Write the bundled DSpark target, examples/targets/tiny-deepseek-v4-dspark: DeepSeek-V4-Flash-0731's layout (a
DeepSeek-V4 trunk whose `mtp.*` tensors are DSpark stages, not an MTP layer) made of tiny-deepseek-v4's trunk and a
DSpark drafter trained on it post hoc.

    python scripts/dspark_target.py DRAFTER OUT [--source examples/targets/tiny-deepseek-v4] [--overwrite]

DRAFTER is a DeepSeek-V4 dspark directory (what `save_dspark_v4` or `mtp2draft distill` of one writes) trained
against SOURCE: here benchmarks/bench_dspark_init.py's MTP-initialised drafter after its 150 `distill` steps on
examples/data/train.jsonl, chosen before its figures existed (the project's own question is whether the MTP layer
is a good start, so the bundled drafter starts from it whatever the comparison says).

What it writes into OUT:
- the trunk's tensors, unchanged (bytes and dtypes), and none of SOURCE's MTP layer: the 0731 release ships DSpark
  stages under `mtp.*` instead;
- the stages under the release's names (`draft.dspark_v4_io.release_tensors`), each in the dtype the release keeps
  it in: a stage block tensor as SOURCE's MTP block stores its counterpart (float32 hyper-connection mixers, sinks
  and router bias, bf16 the rest), the head stack's hc_head mixers float32 as the trunk's, everything else bf16.
  bf16, not the release's FP8 / FP4: the bundled targets are bf16, and the quantised layout has its own fixtures;
- two shards and an index, config.json = SOURCE's with the drafter's `dspark_*` fields (num_nextn_predict_layers
  kept at 1, as the release keeps it over three stages), SOURCE's tokenizer and generation config;
- training.json: SOURCE's and DRAFTER's file hashes, the drafter's `distill` record (settings, data hash, curve,
  command) and this command.
Then it reads OUT back as a user would (`conversion.convert` into a temporary directory) and checks that the stages
equal DRAFTER's tensors rounded to the stored dtypes, and the trunk SOURCE's.

What it does not do: train (`mtp2draft distill` does, driven by the benchmark), quantise, or touch SOURCE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mtp2draft.checkpoint.reader import INDEX_FILE
from mtp2draft.draft.dspark_v4_io import load_dspark_v4, release_tensors, with_dspark_keys
from mtp2draft.kinds import CONFIG_FILE, WEIGHTS_FILE
from mtp2draft.manifest import write_json
from mtp2draft.outputs.directories import atomic_output_dir
from mtp2draft.outputs.writer import save_tensors

REPO = Path(__file__).resolve().parents[1]
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
PREFIX = "mtp."
HEAD_MIXERS = ("hc_head_fn", "hc_head_base", "hc_head_scale")  # float32 on the trunk and on the last stage


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_tensors(source: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """SOURCE's tensors by name, and its shard files in order."""
    index = json.loads((source / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(str(source / shard)))
    return tensors, shards


def stored_dtype(name: str, mtp_layer: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype the release keeps stage tensor `name` (mtp.{i}.<rest>) in (see the module docstring)."""
    rest = name.split(".", 2)[2]
    if rest in HEAD_MIXERS:
        return torch.float32
    counterpart = mtp_layer.get(f"{PREFIX}0.{rest}")
    return counterpart.dtype if counterpart is not None else torch.bfloat16


def _portable(record: object, work: Path) -> object:
    """The record with this machine's paths written as the reader's: the repository's relative, the drafter's work
    directory as WORK (a training.json is read on other machines)."""
    text = json.dumps(record).replace(f"{REPO}/", "").replace(f"{work}/", "WORK/")
    return json.loads(text)


def build(drafter: Path, source: Path, out: Path, overwrite: bool, command: str) -> Path:
    tensors, shards = source_tensors(source)
    mtp_layer = {k: v for k, v in tensors.items() if k.startswith(PREFIX)}
    trunk = {k: v for k, v in tensors.items() if not k.startswith(PREFIX)}
    config = json.loads((source / CONFIG_FILE).read_text())
    head = trunk["head.weight"].float()
    draft = load_dspark_v4(drafter, trunk["embed.weight"].float(), head)
    stages = {k: v.to(stored_dtype(k, mtp_layer)).contiguous() for k, v in release_tensors(draft).items()}
    # two shards as the source has: the trunk's first half, then its second half and the stages
    names = list(trunk)
    half = len(names) // 2
    parts = [{k: trunk[k] for k in names[:half]}, {**{k: trunk[k] for k in names[half:]}, **stages}]
    files = [f"model-{i:05d}-of-{len(parts):05d}.safetensors" for i in range(1, len(parts) + 1)]
    provenance = _portable(
        json.loads((drafter / "provenance.json").read_text()) if (drafter / "provenance.json").is_file() else {},
        drafter.resolve().parent,
    )
    with atomic_output_dir(out, overwrite) as tmp:
        weight_map = {}
        for file, part in zip(files, parts, strict=True):
            save_tensors(tmp / file, part, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, file))
        size = sum(v.numel() * v.element_size() for part in parts for v in part.values())
        write_json(tmp / INDEX_FILE, {"metadata": {"total_size": size}, "weight_map": weight_map})
        write_json(tmp / CONFIG_FILE, with_dspark_keys(config, draft.fields))
        for name in COPIED:
            shutil.copyfile(source / name, tmp / name)
        write_json(
            tmp / "training.json",
            {
                "what": "tiny-deepseek-v4's trunk with a DSpark drafter trained post hoc under mtp.* (DeepSeek-V4-"
                "Flash-0731's layout); scripts/dspark_target.py",
                "source": {"path": str(source.relative_to(REPO)), "sha256": {s: _sha256(source / s) for s in shards}},
                "drafter": {
                    "num_stages": draft.num_stages,
                    "dspark": draft.fields.summary(),
                    "sha256": _sha256(drafter / WEIGHTS_FILE),
                    "parameters": sum(v.numel() for v in stages.values()),
                    "distill": provenance.get("distill"),
                },
                "made_by": "python benchmarks/bench_dspark_init.py WORK (its mtp-150 drafter)",
                "command": _portable(command, drafter.resolve().parent),
            },
        )
    check(out, stages, trunk)
    return out


def check(out: Path, stages: dict[str, torch.Tensor], trunk: dict[str, torch.Tensor]) -> None:
    """Read OUT back through `convert`: the stages are the drafter's, the trunk is SOURCE's, bit for bit."""
    from mtp2draft.conversion import convert

    with tempfile.TemporaryDirectory() as tmp:
        converted = Path(tmp) / "draft"
        convert(str(out), converted)
        got = load_file(str(converted / WEIGHTS_FILE))
    assert set(got) == set(stages), sorted(set(got) ^ set(stages))[:4]
    for name, value in stages.items():
        assert torch.equal(got[name].to(value.dtype), value), name
    for file in sorted({p.name for p in out.glob("*.safetensors")}):
        with safe_open(str(out / file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118
                if name in trunk:
                    assert torch.equal(fh.get_tensor(name), trunk[name]), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=REPO / "examples" / "targets" / "tiny-deepseek-v4")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    command = " ".join(["python", "scripts/dspark_target.py", *sys.argv[1:]])
    out = build(args.drafter, args.source.resolve(), args.out, args.overwrite, command)
    print(out)


if __name__ == "__main__":
    main()
