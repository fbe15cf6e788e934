"""Families mtp2draft knowingly does not convert, each with its reason: data files in `model_specs/not_supported/`.

A row names the `architectures` / `model_types` it matches, a `reason` (one clause, shown to the user as it stands)
and the `sources` the reason was read from. `mtp2draft specs` lists the rows beside the supported families, and a
checkpoint of such a family is refused in one line carrying the reason instead of "no spec matches".

What this module does not do: refuse checkpoints whose MTP-named tensors hold another drafter whatever the family
(DSpark: `family.not_supported.NOT_MTP_FIELDS`), or decide anything about families that have a spec (a spec always wins, so a
user spec in $MTP2DRAFT_SPEC_PATH can take a row's family on).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mtp2draft.errors import NotMtpError, NotSupportedError, SpecError
from mtp2draft.family.identity import FamilyIdentity, named_in
from mtp2draft.kinds import SUPPORTED_SO_FAR

FOLDER = "not_supported"
_FIELDS = ("name", "description", "architectures", "model_types", "reason", "sources")


@dataclass(frozen=True)
class NotSupported(FamilyIdentity):
    reason: str
    """Why mtp2draft does not convert it: one clause, completing "<description>: not supported, because ..."."""
    sources: str
    """Where the reason was read (engine / transformers versions, issue threads)."""

    def summary(self) -> dict[str, Any]:
        """The row `specs --json` prints: `supported` false, the reason and its sources."""
        return {**self.identity_row(), "reason": self.reason, "sources": self.sources, "supported": False}


def parse(data: Mapping[str, Any], path: str) -> NotSupported:
    """Validate one row: exactly the known keys, strings and lists of strings, something to match."""
    unknown, missing = sorted(set(data) - set(_FIELDS)), sorted(set(_FIELDS) - set(data))
    if unknown or missing:
        raise SpecError(f"{path}: unknown key(s) {unknown} / missing key(s) {missing}; a row has {', '.join(_FIELDS)}")
    for key in _FIELDS:
        value = data[key]
        listed = key in ("architectures", "model_types")
        good = isinstance(value, list) and all(isinstance(v, str) for v in value) if listed else isinstance(value, str)
        if not good or (not listed and not value):
            raise SpecError(f"{path}: {key} must be {'a list of strings' if listed else 'a non-empty string'}")
    if not data["architectures"] and not data["model_types"]:
        raise SpecError(f"{path}: a row must match at least one architecture or model_type")
    if data["name"] != Path(path).stem:
        raise SpecError(f"{path}: name {data['name']!r} must equal the file name {Path(path).stem!r}")
    return NotSupported(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@cache
def rows() -> dict[str, NotSupported]:
    """Every shipped row by name."""
    folder = resources.files("mtp2draft.model_specs") / FOLDER
    out = {}
    for file in sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".toml")):
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"{file}: not valid TOML: {exc}") from exc
        out[file.stem] = parse(data, str(file))
    return out


def refuse_not_supported(config: Mapping[str, Any]) -> None:
    """NotSupportedError, in one line with the row's reason, when config.json is of a family listed here."""
    for row in rows().values():
        if row.matches(config):
            raise NotSupportedError(
                f"{row.description} ({named_in(config)}): not supported, because {row.reason} "
                f"(see `mtp2draft specs`, model_specs/{FOLDER}/{row.name}.toml)"
            )


# config.json fields saying the MTP-named tensors are another drafter. DeepSeek-V4-0731 / V4.1 keep a DSpark block
# drafter (no enorm / hnorm / projection) under `mtp.*`; vLLM 0.33 serves it as "dspark", refuses "mtp" for V4.1.
NOT_MTP_FIELDS = {"dspark_block_size": "a DSpark block drafter (served by vLLM's speculative method 'dspark')"}


def refuse_non_mtp(config: Mapping[str, Any]) -> None:
    """NotMtpError when config.json (or its text_config) marks the MTP-named tensors as another kind of drafter."""
    sections = [config, config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}]
    for section in sections:
        for name, what in NOT_MTP_FIELDS.items():
            if section.get(name) is not None:
                raise NotMtpError(
                    f"this checkpoint's MTP tensors are {what}, not an MTP layer (config.json: {name} = "
                    f"{section[name]!r}), which mtp2draft will not half-load as one: {SUPPORTED_SO_FAR}"
                )
