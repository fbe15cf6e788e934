"""How an exported draft is served, from one source: the k every launch line drafts, the launch lines themselves (for
a local or a Hub target and draft), the step that lays a stitched overlay over its target, and the config the engine
needs where it parses a family's released config under another type. The export README, the model card (`hub/card.py`) and
`run`'s summary all print what this module returns, so they cannot disagree.

What this module does not do: check that an engine serves the draft (the family's spec says), or write any file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtp2draft.family.schema import ENGINES, Spec
from mtp2draft.formats import REGISTRY, format_kind, get_format

DEFAULT_K = 3
STITCHED_DIR = "./target-stitched"  # where the overlay lines put the target and lay the overlay over it
# the export README's sections that give local launch lines: a model card leaves them out and gives its own
SERVE_SECTIONS = ("Overlay it onto the target", "Serve")
OVERLAY_FILES = ("*.safetensors", "model.safetensors.index.json", "config.json")
OVERLAY_FORMATS = ("stitched", "stitched-dspark")  # the formats whose lines start by laying the overlay over the target

# launch-line label -> engine (spec.ENGINES) whose support for the family gates it
LINE_ENGINES = {"SGLang": "sglang", "vLLM": "vllm", "vLLM (speculators config)": "vllm"}


def serving_k(provenance: Mapping[str, Any] | None, evaluation: Mapping[str, Any] | None, layers: int = 1) -> int:
    """The k every launch line of a draft drafts: the k its export wrote (`export --speculative-tokens`, which `run`
    sets to the evaluation's -k), else the k it was evaluated at, else DEFAULT_K; never fewer than a chain's layers
    (each layer runs only when the engine drafts at least that many steps)."""
    written = ((provenance or {}).get("export") or {}).get("speculative_tokens")
    results = (evaluation or {}).get("results") or []
    measured = results[0].get("num_draft_tokens") if results else None
    for k in (written, measured):
        if isinstance(k, int) and not isinstance(k, bool) and k > 0:
            return max(k, layers)
    return max(DEFAULT_K, layers)


def is_hub_id(ref: str) -> bool:
    """Whether `ref` names a Hub repo (org/name) rather than a local directory."""
    if Path(ref).expanduser().exists() or ref.startswith((".", "/", "~")):
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", ref)) and ".." not in ref


def local_ref(path: str | Path) -> str:
    """A local directory as the lines name it: a relative path gets `./`, so neither `hf` nor `is_hub_id` takes
    `out/draft` for a Hub repo."""
    text = str(path)
    return text if text.startswith(("/", ".", "~")) else f"./{text}"


def overlay_lines(target: str, draft: str, revision: str | None = None, spec: Spec | None = None) -> list[str]:
    """The shell lines that put the target in STITCHED_DIR and lay the stitched overlay `draft` over it, each run from
    the same directory: `hf download` for a Hub repo, `cp` for a local directory (-L: a Hub cache snapshot holds
    links). Then, for a family whose config vLLM parses under another type, the rewrite vLLM needs."""
    rev = f" --revision {revision}" if revision else ""
    if is_hub_id(target):
        lines = [f"hf download {target}{rev} --local-dir {STITCHED_DIR}"]
    else:
        lines = [f"cp -rL {target} {STITCHED_DIR}"]
    if is_hub_id(draft):
        # one --include per pattern: `hf download` reads the words after the first as file names, not patterns
        files = " ".join(f"--include '{f}'" if "*" in f else f"--include {f}" for f in OVERLAY_FILES)
        lines.append(f"hf download {draft} {files} --local-dir {STITCHED_DIR}")
    else:
        root = draft.rstrip("/")
        lines.append("cp " + " ".join(f"{root}/{f}" for f in OVERLAY_FILES) + f" {STITCHED_DIR}/")
    view = config_view_line(spec, STITCHED_DIR)
    return lines + ([view] if view else [])


def vllm_config_view(spec: Spec | None) -> dict[str, Any]:
    """The config.json fields vLLM reads instead of the release's for the family (its `[engines.vllm] config_view`);
    empty when vLLM reads the config as released."""
    facts = spec.engine("vllm") if spec else None
    return dict(facts.config_view) if facts else {}


def config_view_line(spec: Spec | None, where: str) -> str | None:
    """The line that rewrites `where`/config.json as vLLM must read it (`vllm_config_view`), or None when vLLM reads
    the family's config as released."""
    view = vllm_config_view(spec)
    if not view:
        return None
    edits = " ".join(f'-e \'s/"{key}": *"[^"]*"/"{key}": "{value}"/\'' for key, value in view.items())
    return f"sed -i {edits} {where}/config.json"


def launch_lines(
    fmt: str,
    target: str,
    draft: str,
    k: int = DEFAULT_K,
    spec: Spec | None = None,
    layers: int = 1,
    revision: str | None = None,
) -> dict[str, str]:
    """Label -> the command that serves this draft. SGLang counts the root token: its k + 1 draft tokens are vLLM's
    k speculative tokens. With the target family's `spec`, only the engines its support table says run this draft
    kind (`[engines.*] methods`) and, for a chain of `layers` > 1 MTP layers, a chain (`step_layers` other than
    "neither") get a line. A stitched overlay's lines start with the overlay (`overlay_lines`)."""
    lines = get_format(fmt).launch_lines(target, draft, k) if fmt in REGISTRY else {}
    if fmt in OVERLAY_FORMATS:
        lines = {"overlay": " && ".join(overlay_lines(target, draft, revision, spec)), **lines}
    if spec is None:
        return lines
    method = format_kind(fmt)
    return {
        label: line
        for label, line in lines.items()
        if label not in LINE_ENGINES or spec.runs(LINE_ENGINES[label], method, layers)
    }


def unsupported_engines(fmt: str, spec: Spec, layers: int = 1) -> list[str]:
    """'vllm 0.33.0'-style names of the engines that cannot run this format's draft kind (of `layers` MTP layers)
    for the family."""
    method = format_kind(fmt)
    out = []
    for engine in ENGINES:
        if not spec.runs(engine, method, layers):
            facts = spec.engine(engine)
            out.append(f"{engine} {facts.version}" if facts else engine)
    return out


def config_view_note(spec: Spec | None) -> str | None:
    """What the overlay's config rewrite is for, where the family has one (`vllm_config_view`)."""
    view = vllm_config_view(spec)
    if not spec or not view:
        return None
    released = spec.model_types[0] if spec.model_types else spec.name
    fields = ", ".join(f"`{k}: {v}`" for k, v in view.items())
    return (
        f"The overlay's last line makes config.json say {fields}: vLLM parses config.json with transformers, which "
        f"knows no `{released}` type (the release ships remote code for it); vLLM still picks its own "
        f"{'/'.join(spec.architectures)} class from `architectures`, so the model it runs is the same."
    )


def serving_text(lines: Mapping[str, str], notes: list[str] | None = None, spec: Spec | None = None) -> list[str]:
    """The launch lines as a README or card prints them (a label, then the line in a bash block), with the engine
    notes (`formats.native.engine_mismatches`) after the line of the engine each names, and after the overlay what
    its config rewrite is for."""
    out: list[str] = []
    for label, line in lines.items():
        out += [f"{label}:", "", "```bash", line, "```", ""]
        view = config_view_note(spec) if label == "overlay" else None
        out += [view] if view else []
        engine = LINE_ENGINES.get(label)
        out += [f"Note: {n}." for n in notes or [] if engine and n.startswith(engine + " ")]
        if out[-1] != "":
            out.append("")
    return out
