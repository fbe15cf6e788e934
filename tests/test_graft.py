"""`export --format stitched --target R` for releases that lost their draft (`formats/graft.py`): a fine-tune that
dropped the MTP layer and a W4A16 export without one receive the base's layer, in its own shard, indexed, counted
and excluded as the engines read it; an int4 layer is replaced by bf16; a release whose trunk is not the draft's is
refused in one line; the release itself is never written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.re_releases import release_variant

from mtp2draft.checkpoint.reader import open_checkpoint
from mtp2draft.cli.app import main
from mtp2draft.conversion import convert, inspect_checkpoint
from mtp2draft.errors import DraftError
from mtp2draft.formats.export import export, validate
from mtp2draft.pipeline import BUNDLED_TARGET

MTP = "model.layers.8."


@pytest.fixture(scope="module")
def base_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "draft"
    convert(str(BUNDLED_TARGET), out)
    return out


def _tree_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        if file.is_file():
            digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def _overlay(release: Path, st: Path, out: Path) -> Path:
    """What the README says: a copy of the release with the overlay's files on top."""
    shutil.copytree(release, out)
    for name in json.loads((st / "provenance.json").read_text())["export"]["overlay_files"]:
        shutil.copyfile(st / name, out / name)
    return out


# a fine-tune that dropped the layer (its count field still says 1); a W4A16 export that dropped it and says 0
@pytest.mark.parametrize(("scheme", "count"), [(None, None), ("int4", 0)])
def test_a_release_without_the_layer_receives_the_bases(scheme, count, base_draft: Path, tmp_path: Path) -> None:
    release = release_variant(BUNDLED_TARGET, tmp_path / "release", MTP, scheme=scheme, mtp="drop", count=count)
    before = _tree_digest(release)
    st = tmp_path / "st"
    export(base_draft, "stitched", st, target=str(release))
    assert _tree_digest(release) == before  # the release is an input: never written
    assert validate(st) == []
    record = json.loads((st / "provenance.json").read_text())["export"]
    assert record["grafted"] and record["overlay_files"][0] == "model-mtp-00001-of-00001.safetensors"
    served = _overlay(release, st, tmp_path / "served")
    check = inspect_checkpoint(str(served))["release"]
    assert check["status"] == "ok", check["verdict"]
    assert check["layers"][0]["place"] == "a separate file the index names"
    config = json.loads((served / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    if scheme:  # the int4 config excludes the grafted bf16 layer in its keys' namespace
        assert r"re:model\.layers\.8\..*" in config["quantization_config"]["ignore"]
    # read back as the engines read it: the draft's weights exactly (bf16 -> bf16), the stored embed / head copies
    # the release's own trunk tensors
    convert(str(served), tmp_path / "back")
    back, fine = load_file(tmp_path / "back" / "model.safetensors"), load_file(base_draft / "model.safetensors")
    assert back.keys() == fine.keys() and all(torch.equal(back[k], fine[k]) for k in fine)
    graft = load_file(st / "model-mtp-00001-of-00001.safetensors")
    trunk = open_checkpoint(str(release)).read_weights(["lm_head.weight", "model.embed_tokens.weight"])
    assert torch.equal(graft[MTP + "shared_head.head.weight"], trunk["lm_head.weight"].to(torch.bfloat16))
    assert torch.equal(graft[MTP + "embed_tokens.weight"], trunk["model.embed_tokens.weight"].to(torch.bfloat16))


def test_an_int4_layer_is_written_back_bf16_and_excluded(base_draft: Path, tmp_path: Path) -> None:
    release = release_variant(BUNDLED_TARGET, tmp_path / "release", MTP, scheme="int4")
    assert inspect_checkpoint(str(release))["release"]["status"] == "weak"
    st = tmp_path / "st"
    export(base_draft, "stitched", st, target=str(release))
    assert validate(st) == []
    check = inspect_checkpoint(str(_overlay(release, st, tmp_path / "served")))["release"]
    assert check["status"] == "ok", check["verdict"]
    assert set(check["layers"][0]["storages"]) == {"bf16"}


def test_validate_reports_a_bf16_layer_the_config_would_quantise(base_draft: Path, tmp_path: Path) -> None:
    release = release_variant(BUNDLED_TARGET, tmp_path / "release", MTP, scheme="int4", mtp="drop")
    st = tmp_path / "st"
    export(base_draft, "stitched", st, target=str(release))
    config = json.loads((st / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", r"re:model\.language_model\.layers\.8\..*"]
    (st / "config.json").write_text(json.dumps(config))
    problems = validate(st)
    assert problems and all("builds it compressed-tensors-quantised" in p for p in problems), problems


# what the release changed -> the refusal's needle
REFUSALS = {
    "hidden_size": ({"hidden_size": 512}, "has hidden_size 256, the target"),
    "vocab_size": ({"vocab_size": 4000}, "has vocab_size 4096, the target"),
    "num_hidden_layers": ({"num_hidden_layers": 7}, "num_hidden_layers 8 (draft) vs 7 (target)"),
}


@pytest.mark.parametrize("row", list(REFUSALS))
def test_a_release_with_another_trunk_is_refused_in_one_line(row, base_draft: Path, tmp_path: Path, capsys) -> None:
    edit, needle = REFUSALS[row]
    release = release_variant(BUNDLED_TARGET, tmp_path / "release", MTP, mtp="drop")
    config = json.loads((release / "config.json").read_text())
    (release / "config.json").write_text(json.dumps({**config, **edit}))
    code = main(
        ["export", str(base_draft), "--format", "stitched", "--target", str(release), "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code != 0 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_release_with_another_tokenizer_is_refused(base_draft: Path, tmp_path: Path) -> None:
    release = release_variant(BUNDLED_TARGET, tmp_path / "release", MTP, mtp="drop")
    tok = json.loads((release / "tokenizer.json").read_text())
    (release / "tokenizer.json").write_text(json.dumps({**tok, "added_tokens": []}) + " ")
    with pytest.raises(DraftError, match="tokenizer.json differs"):
        export(base_draft, "stitched", tmp_path / "o", target=str(release))
