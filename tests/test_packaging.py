"""The wheel: model_specs/ ships inside it as package data, and the console script works from a clean venv."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mtp2draft.family.dspark import layouts as dspark_layouts
from mtp2draft.family.not_supported import rows as not_supported_rows
from mtp2draft.family.spec import registry

REPO = Path(__file__).resolve().parents[1]


def test_the_package_has_no_test_support_subpackage() -> None:
    """Fixtures and the loopback Hub live in tests/support/: a subpackage of mtp2draft that the wheel left out would
    import in a checkout and fail after `pip install`."""
    import pkgutil

    import mtp2draft

    assert not (REPO / "mtp2draft" / "testing").exists()
    assert "testing" not in {m.name for m in pkgutil.iter_modules(mtp2draft.__path__)}


def test_every_subpackage_is_listed_for_the_wheel() -> None:
    """pyproject's explicit package list: a subpackage missing from it imports in a checkout and is absent from the
    wheel (`mtp2draft.outputs` was, and every installed command failed on import)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mtp2draft").rglob("__init__.py")}
    assert found - listed == set()


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv_and_lists_the_specs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("mtp2draft-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    # the suite's support code (tests/support/) stays in the repository: only the package and its metadata ship
    assert {n.split("/")[0] for n in names} == {"mtp2draft", wheel.name.split("-py")[0] + ".dist-info"}
    assert sorted(n for n in names if n.startswith("mtp2draft/model_specs/") and n.endswith(".toml")) == sorted(
        [f"mtp2draft/model_specs/{name}.toml" for name in registry()]
        + [f"mtp2draft/model_specs/not_supported/{name}.toml" for name in not_supported_rows()]
        + [f"mtp2draft/model_specs/dspark/{name}.toml" for name in dspark_layouts()]
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # the wheel goes into the clean venv; its dependencies (torch, transformers, ...) are borrowed from ours via a
    # plain path entry, which does not run our editable install's hook, so `mtp2draft` can only come from the wheel
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import mtp2draft; print(mtp2draft.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(str(site))
    out = subprocess.run(
        [str(venv / "bin" / "mtp2draft"), "specs", "--json"], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout
    rows = json.loads(out)
    assert [row["name"] for row in rows if row["supported"] and "draft_kind" not in row] == list(registry())
    assert [row["name"] for row in rows if not row["supported"]] == list(not_supported_rows())
    assert [row["name"] for row in rows if row.get("draft_kind") == "dspark"] == list(dspark_layouts())  # shipped
