"""Every SGLang launch line mtp2draft prints parses under SGLang 0.5.23's own command-line parser: each flag exists
(spelled in full), each value has the flag's type and is one of its `choices`, no required flag is missing, and the
speculative algorithm is one SGLang resolves. The parser is rebuilt from tests/data/engines/, which
scripts/engine_args.py writes from the sglang 0.5.23 wheel (PyPI) without running it (its docstring says how to
rerun it for a new release, and what it cannot see: choices computed at run time are recorded as null).

The lines come from `serving.launch_lines`, the one source the export README, the model card and `run`'s summary
print, for every family spec, every format and one- and two-layer chains; and, end to end, from the README, card and
summary of a tiny stitched MiMo export.

What this module does not check: that SGLang serves the draft (the family specs say which engines run which kind),
or the checks SGLang makes after parsing other than the algorithm's name."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from mtp2draft.family.spec import registry
from mtp2draft.formats import REGISTRY
from mtp2draft.formats.serving import launch_lines

SGLANG = "0.5.23"
ARGS = Path(__file__).parent / "data" / "engines" / f"sglang-{SGLANG}-server-args.json"
PREFIX = ["python", "-m", "sglang.launch_server"]
VALUE_TYPES = {"int": int, "float": float, "json": json.loads}  # any other type: SGLang's own parser, taken as str
NO_VALUE = {"store_true", "DeprecatedStoreTrueAction"}  # SGLang's Deprecated*Action with nargs 0 stores a constant


class Refused(Exception):
    """What argparse would print before exiting 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits; a test wants the message
        raise Refused(message)


def sglang_parser(path: Path = ARGS) -> tuple[argparse.ArgumentParser, dict]:
    """(a parser with SGLang's flags, as `prepare_server_args` builds it; the values checked after parsing). Unlike
    SGLang's (argparse's default), it takes no abbreviation: `--speculative-algo` would reach SGLang 0.5.23 as
    `--speculative-algorithm` today, and as an error once another flag starts with it."""
    data = json.loads(path.read_text())
    parser = _Parser(prog="sglang serve", allow_abbrev=False, add_help=False)
    for flag in data["flags"]:
        kwargs: dict = {"required": flag.get("required", False)}
        if flag["action"] in NO_VALUE or (flag["type"] == "bool" and flag["action"] != "boolean_optional"):
            kwargs["action"] = "store_true"
        elif flag["action"] == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs |= {
                "type": VALUE_TYPES.get(flag["type"], str),
                "choices": flag["choices"],
                "nargs": flag.get("nargs"),
            }
        parser.add_argument(*flag["flags"], **kwargs)
    return parser, data["later"]


def check_line(line: str, parser: argparse.ArgumentParser, later: dict) -> argparse.Namespace:
    """Parse one launch line as `python -m sglang.launch_server` would; raise Refused with SGLang's complaint."""
    words = shlex.split(line)
    if words[:3] != PREFIX:
        raise Refused(f"not an SGLang launch line: {line}")
    args = parser.parse_args(words[3:])
    algorithm = args.speculative_algorithm
    if algorithm is not None and algorithm.upper() not in later["--speculative-algorithm"]["values"]:
        raise Refused(f"Unknown speculative algorithm name: {algorithm}")  # SpeculativeAlgorithm.from_string
    return args


@pytest.fixture(scope="module")
def sglang() -> tuple[argparse.ArgumentParser, dict]:
    return sglang_parser()


def _printed_lines() -> dict[str, str]:
    """id -> every SGLang line `launch_lines` gives, by family, format, chain length and target/draft naming."""
    out = {}
    places = {"hub": ("org/Target-1", "me/draft", "0123abc"), "local": ("./target", "./out/draft", None)}
    for name, spec in sorted(registry().items()):
        for fmt in REGISTRY:
            for layers in (1, 2):
                for where, (target, draft, revision) in places.items():
                    for k in (1, 3):
                        line = launch_lines(fmt, target, draft, max(k, layers), spec, layers, revision).get("SGLang")
                        if line:
                            out[f"{name}-{fmt}-{layers}layers-{where}-k{k}"] = line
    out["no-spec-placeholder"] = launch_lines("nextn", "<target>", "./draft")["SGLang"]  # the card without a target
    for fmt in ("speculators-dspark", "stitched-dspark"):  # no family spec runs DSpark: the lines without one
        for where, (target, draft, revision) in places.items():
            out[f"dspark-{fmt}-{where}"] = launch_lines(fmt, target, draft, 5, revision=revision)["SGLang"]
    return out


LINES = _printed_lines()


def test_every_kind_of_sglang_line_is_checked() -> None:
    algorithms = {re.search(r"--speculative-algorithm (\S+)", line).group(1) for line in LINES.values()}
    # nextn, the two EAGLE-3 formats, the stitched overlay, the DSpark formats
    assert algorithms == {"NEXTN", "EAGLE3", "EAGLE", "DSPARK"}
    assert len({key.split("-")[0] for key in LINES}) > 1


def test_every_line_parses_under_sglangs_parser(sglang) -> None:
    refused = {}
    for key, line in LINES.items():
        try:
            args = check_line(line, *sglang)
        except Refused as why:
            refused[key] = f"{why}: {line}"
            continue
        if args.speculative_algorithm == "DSPARK":  # one block of G tokens, G the drafter's block size
            assert args.speculative_dspark_block_size == 5 and args.speculative_num_steps is None, line
            continue
        steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
        assert topk == 1 and tokens == steps + 1, line  # SGLang counts the root token
    assert refused == {}


@pytest.mark.parametrize(
    "line, complaint",
    [
        ("--model m --speculative-algo NEXTN", "unrecognized arguments: --speculative-algo"),
        ("--model m --speculative-algorithm EAGEL", "Unknown speculative algorithm name: EAGEL"),
        ("--model m --speculative-num-steps three", "invalid int value: 'three'"),
        ("--model m --speculative-draft-load-format zip", "invalid choice: 'zip'"),
        ("--speculative-algorithm EAGLE", "the following arguments are required: --model-path/--model"),
    ],
)
def test_the_parser_refuses_what_sglang_refuses(line: str, complaint: str, sglang) -> None:
    with pytest.raises(Refused, match=re.escape(complaint)):
        check_line("python -m sglang.launch_server " + line, *sglang)


def test_the_readme_card_and_summary_lines_parse(target, tmp_path, monkeypatch, sglang) -> None:
    """The lines as printed, end to end: a stitched MiMo export's README, its model card and `run`'s summary."""
    from mtp2draft.conversion import convert
    from mtp2draft.formats.export import export
    from mtp2draft.hub.card import model_card, serve_text

    source = target("mimo", num_hidden_layers=4)
    monkeypatch.chdir(tmp_path)
    convert(str(source), Path("mtp"), to="mtp")
    export(Path("mtp"), "stitched", Path("out"), target=str(source))
    texts = {
        "README": (tmp_path / "out" / "README.md").read_text(),
        "card": str(model_card(tmp_path / "out", "me/tiny-mimo-stitched")),
        "summary": "\n".join(serve_text(tmp_path / "out")),
    }
    for where, text in texts.items():
        lines = [p for line in text.splitlines() for p in line.split(" && ") if "sglang.launch_server" in p]
        assert lines, f"the {where} prints no SGLang line"
        for line in lines:
            check_line(line.strip(), *sglang)
