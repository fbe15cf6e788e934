"""What a reader of docs/ and the repository's folders can rely on: pages short enough to read, the results page
giving each figure's date and command, no private issue numbers, links that land, and scripts/ holding the user
tools only, with every benchmark and reproduction described in its folder's README, and no tracked file pointing
outside the repository (a path no user has).

What this module does not check: that a figure is right (the benchmarks measure, the tests of each stage prove), or
the README's own length and sentences."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGE_LINES, RESULTS_LINES, SCRIPTS = 450, 300, 10  # engine_args.py (SGLang flag reader), dspark_target.py (a target)
# another project's issue or PR may be cited by its project's name ("vLLM PR 45895"); this project's may not
PROJECTS = {"vllm", "sglang", "speculators", "transformers", "tensorrt-llm", "huggingface_hub", "pytorch", "torch"}
_REFERENCE = re.compile(r"(?:(\S+)\s+)?((?:issues?|PRs?|pull requests?)\s+#?\d+)", re.I)
_HASH = re.compile(r"(?<![\w/&])#\d+\b")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# a path outside the repository: a sibling `shared` folder, or the machine's work tree (pieced so this file is clean)
_OUTSIDE = re.compile("|".join([r"\.\./" + "shared\\b", r"(?<![\w.~-])/" + "work/"]))


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _readable() -> list[Path]:
    """Every markdown file a user reads: the README, docs/, and the folders' READMEs."""
    return [ROOT / "README.md", *_pages(), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def private_references(text: str) -> list[str]:
    """Issue / PR numbers in `text` not attributed to another project by name, and bare `#123`s."""
    named = [((m.group(1) or "").strip("(").lower(), m.group(2)) for m in _REFERENCE.finditer(text)]
    found = [ref for project, ref in named if project not in PROJECTS and "/" not in project]  # owner/repo names one
    return found + _HASH.findall(text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_private_references_are_found_and_engine_ones_allowed() -> None:
    assert private_references("as issue 17 asked, see #12 and issues 3") == ["issue 17", "issues 3", "#12"]
    assert private_references("PR 7 at the start") == ["PR 7"]
    assert private_references("since vLLM PR 45895 (vLLM issue 39680; SGLang\nPR 3582)") == []
    assert private_references("(MiniMax-AI/MiniMax-M3 issue 13)") == []
    assert private_references("[a](#section-2) top-1 &#39;") == []


def test_no_page_in_docs_is_too_long_to_read() -> None:
    lengths = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _pages()}
    assert {p: n for p, n in lengths.items() if n > PAGE_LINES} == {}
    assert lengths["docs/results.md"] <= RESULTS_LINES


def test_docs_hold_no_issue_numbers_of_this_project() -> None:
    found = {p.relative_to(ROOT).as_posix(): private_references(p.read_text()) for p in _readable()[1:]}
    assert {p: refs for p, refs in found.items() if refs} == {}


def test_every_results_section_dates_its_figures_and_names_their_command() -> None:
    text = (DOCS / "results.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    measured = [s for s in sections if "\n|---|" in s]  # a section with a table of figures
    assert len(measured) >= 6
    for section in measured:
        title = section.splitlines()[0]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"results.md, {title!r}: no date"
        assert re.search(r"`(python |mtp2draft |pytest |CI=1 )", section), f"results.md, {title!r}: no command"


def test_relative_links_land_on_a_file_and_a_heading() -> None:
    broken = []
    for page in _readable():
        text = page.read_text()
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def outside_references(text: str) -> list[str]:
    """The paths in `text` that point outside the repository."""
    return _OUTSIDE.findall(text)


def _tracked() -> list[Path]:
    """The repository's tracked files (what a clone holds)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_outside_references_are_found() -> None:
    planted = "see `../" + "shared/reference/x.md` and --out /" + "work/train-out"
    assert outside_references(planted) == ["../" + "shared", "/" + "work/"]
    assert outside_references("../" + "shared_head, https://example.org/work/x, docs/work/x, ~/work/x") == []


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = {}
    for path in _tracked():
        data = path.read_bytes() if path.is_file() else b""
        if b"\0" in data[:8192]:  # weights and other binary files
            continue
        refs = outside_references(data.decode("utf-8", "replace"))
        if refs:
            found[path.relative_to(ROOT).as_posix()] = refs
    assert found == {}, "cite the public source (engine file + version, repo#PR, paper), not a local path"


def test_scripts_hold_the_user_tools_and_every_benchmark_is_described() -> None:
    scripts = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file())
    assert len(scripts) <= SCRIPTS, scripts
    assert {"demo.sh", "test.sh", "train_target.py", "bench_gpu.sh"} <= set(scripts)
    folders = [p for p in (ROOT / "benchmarks").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
    for folder in [ROOT / "benchmarks", *folders]:
        readme = (folder / "README.md").read_text()
        undescribed = [p.name for p in folder.glob("*.py") if f"`{p.name}`" not in readme]
        assert undescribed == [], f"{folder.relative_to(ROOT)}/README.md does not describe {undescribed}"
        for script in folder.glob("*.py"):
            assert f"{script.relative_to(ROOT).as_posix()}" in readme, f"no command for {script.name}"


# ---- the generated tables and the module names a page gives -------------------------------------------------------
_TOP = sorted(p.stem for p in (ROOT / "mtp2draft").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
# `[` before a name opens a spec's TOML table (`[engines.vllm]`), not a module of the `engines` package
_NAMED = re.compile(rf"(?<![\w./\[-])(?:mtp2draft[./])?((?:{'|'.join(_TOP)})(?:[./][A-Za-z_]\w*)+)")
_SUFFIXES = {"py", "json", "jsonl", "md", "toml", "png", "safetensors", "txt"}  # a file's: `data.jsonl` is `data`


def _defined(module: Path, name: str) -> bool:
    """Whether `module` defines or imports `name` at its top level."""
    import ast

    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def unknown_names(text: str) -> list[str]:
    """The dotted or slashed package names in `text` (`train.recipe.distill`, `formats/export.py`) that name no module
    of the package, or no top-level name of the module they point into."""
    package = ROOT / "mtp2draft"
    unknown = []
    for named in _NAMED.findall(text):
        parts = re.split(r"[./]", named)
        if parts[-1] in _SUFFIXES:
            parts = parts[:-1]
        path, rest = package, list(parts)
        while rest and ((path / rest[0]).is_dir() or (path / f"{rest[0]}.py").is_file()):
            path = path / rest.pop(0)
        module = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if path == package or (rest and not _defined(module, rest[0])):
            unknown.append(named)
    return unknown


def test_unknown_module_names_are_found() -> None:
    assert unknown_names("`train.recipe.distill`, `formats/export.py`, `family.schema.ENGINES`, data.jsonl") == []
    assert unknown_names("`[engines.vllm] step_layers`, `engines.vllm_serve.run_vllm`") == []
    assert unknown_names("target.engine_dump --> train.recipe.no_such, `cli/nothing.py`") == [
        "target.engine_dump",
        "train.recipe.no_such",
        "cli/nothing.py",
    ]


def test_architecture_lists_every_module() -> None:
    from doc_tables import MODULE_MAP, descriptions, expected

    text = MODULE_MAP.page.read_text()
    block = expected(MODULE_MAP, text)
    assert MODULE_MAP.block(text) == block, (
        "docs/architecture.md's module map is not the package's modules; `PYTHONPATH=tests python -m doc_tables "
        f"--write` writes:\n{block}"
    )
    assert [m for m, said in descriptions(block).items() if not said] == [], "describe each new module in one line"


def test_the_docs_name_only_modules_that_exist() -> None:
    """A module or function a page names (`train.recipe.distill`, `formats/export.py`) exists: a rename or a move that
    leaves a page behind fails here. formats.md's worked example of a new format is the one name not yet written."""
    unknown = {p.relative_to(ROOT).as_posix(): unknown_names(p.read_text()) for p in _readable()}
    unknown["docs/formats.md"].remove("formats/myfmt.py")
    assert {page: names for page, names in unknown.items() if names} == {}


# module docstrings that name an attribute of a draft object (`draft.hidden_handover`) or a pair (`draft/target`),
# not a module: the only names the check below lets through
_NOT_MODULES = {"draft.initial_hidden", "draft.hidden_shape", "draft.hidden_handover", "draft/target"}


def test_module_docstrings_name_only_modules_that_exist() -> None:
    """A module's docstring that points the reader at another module (`outputs.claims.claim_output`) points at one
    that exists: a move leaves no docstring behind."""
    import ast

    unknown = {}
    for path in sorted((ROOT / "mtp2draft").rglob("*.py")):
        names = set(unknown_names(ast.get_docstring(ast.parse(path.read_text())) or "")) - _NOT_MODULES
        if names:
            unknown[path.relative_to(ROOT).as_posix()] = sorted(names)
    assert unknown == {}


def test_the_format_table_is_the_registry() -> None:
    from doc_tables import FORMAT_TABLE, expected

    from mtp2draft.formats import REGISTRY

    text = FORMAT_TABLE.page.read_text()
    assert FORMAT_TABLE.block(text) == expected(FORMAT_TABLE, text), (
        "run `PYTHONPATH=tests python -m doc_tables --write`"
    )
    assert all(f"| `{name}` |" in text for name in REGISTRY)
