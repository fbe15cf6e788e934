"""The release check (`mtp2draft/target/release.py`, `inspect`'s last lines): for re-releases of the bundled tiny DeepSeek-V3
as people publish them, the verdict an engine's loading implies, one table row each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.re_releases import release_variant

from mtp2draft.pipeline import BUNDLED_TARGET

MTP = "model.layers.8."  # the bundled target's MTP layer (num_hidden_layers 8)

# name -> (release_variant arguments, status, needles of the verdict)
ROWS = {
    "present_and_fine": ({}, "ok", ("ok: 1 MTP layer",)),
    "missing": ({"mtp": "drop"}, "missing", ("holds no MTP layer", "still says 1", "graft one")),
    "int4_quantised": ({"scheme": "int4"}, "weak", ("stored int4", "colibri#8", "graft the bf16 layer")),
    "exclusion_in_the_wrong_namespace": (
        {"scheme": "int4", "mtp": "bf16", "ignore": [r"re:model\.language_model\.layers\.8\..*"]},
        "exclusion",
        ("unquantised", "names another namespace", "add model.layers.8.* to ignore"),
    ),
    "separate_file_not_in_the_index": (
        {"mtp_file": "model-mtp-00001-of-00001.safetensors", "indexed": False},
        "unindexed",
        ("model-mtp-00001-of-00001.safetensors", "does not name", "re-index"),
    ),
    "count_field_wrong": ({"count": 0}, "count", ("says 0", "holds 1", "set num_nextn_predict_layers to 1")),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_release_check_gives_the_verdict_an_engine_implies(row: str, tmp_path: Path) -> None:
    from mtp2draft.conversion import inspect_checkpoint

    kwargs, status, needles = ROWS[row]
    release = release_variant(BUNDLED_TARGET, tmp_path / row, MTP, **kwargs)
    info = inspect_checkpoint(str(release))
    check = info["release"]
    assert check["status"] == status, check["verdict"]
    for needle in needles:
        assert needle in check["verdict"], (needle, check["verdict"])


def test_release_check_reports_place_and_storage_per_group(tmp_path: Path) -> None:
    from mtp2draft.conversion import inspect_checkpoint

    release = release_variant(
        BUNDLED_TARGET, tmp_path / "r", MTP, scheme="int4", mtp="bf16", mtp_file="model-mtp-bf16.safetensors"
    )
    check = inspect_checkpoint(str(release))["release"]
    (layer,) = check["layers"]
    assert layer["prefix"] == "model.layers.8" and layer["place"] == "a separate file the index names"
    assert layer["groups"]["routed experts"] == {"bf16": 24} and layer["groups"]["norms"]["bf16"] >= 3
    assert check["exclusion"] == {"method": "compressed-tensors", "field": "ignore", "patterns": ["lm_head"]}
    assert check["status"] == "exclusion"  # bf16 linears the int4 config does not exclude
    fixed = release_variant(
        BUNDLED_TARGET, tmp_path / "f", MTP, scheme="int4", mtp="bf16", ignore=[r"re:model\.layers\.8\..*"]
    )
    assert inspect_checkpoint(str(fixed))["release"]["status"] == "ok"


def test_inspect_prints_the_verdict_and_json_carries_it(tmp_path: Path, capsys) -> None:
    from mtp2draft.cli.app import main

    release = release_variant(BUNDLED_TARGET, tmp_path / "r", MTP, mtp="drop")
    assert main(["inspect", str(release)]) == 0
    out = capsys.readouterr().out
    assert "verdict       missing: the checkpoint holds no MTP layer" in out
    assert main(["inspect", str(release), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["release"]["status"] == "missing"
