"""Job spec files -> JobSpec: rigbase's own spec (YAML or JSON), a ChainOpera Launch job.yaml, an OpenPAI job
JSON, trainML's job form, told apart by their content (the file name is only used in error lines and as a
last-resort name).

`parse` raises SpecError with one line per error, each naming the field as the user wrote it (a converted
spec's error names the Launch or OpenPAI field) and, for YAML, its line. `convert` prints the rigbase spec a
file becomes, with what the conversion changed as comments. Pure: no I/O, no clock."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import yaml
from pydantic import ValidationError

from contracts.jobspec import FieldPath, JobSpec, RuleErrors, SpecError, format_path, spec_errors
from provisioner.domain import job_launch, job_openpai, job_trainml
from provisioner.domain.job_source import Converted, Source, load, where

__all__ = ["ParsedSpec", "SpecError", "SpecFormat", "convert", "detect", "dump", "parse", "read"]


class SpecFormat(StrEnum):
    RIGBASE = "rigbase"
    LAUNCH = "chainopera-launch"
    OPENPAI = "openpai"
    TRAINML = "trainml"


FORMAT_TITLES: Final[dict[SpecFormat, str]] = {
    SpecFormat.RIGBASE: "a rigbase job spec",
    SpecFormat.LAUNCH: "a ChainOpera Launch job.yaml",
    SpecFormat.OPENPAI: "an OpenPAI job JSON",
    SpecFormat.TRAINML: "a trainML job form",
}


@dataclass(frozen=True)
class ParsedSpec:
    spec: JobSpec
    format: SpecFormat
    notes: list[str]  # what a conversion changed or dropped; empty for a rigbase spec


# Formats people hand to `job create` that rigbase does not read, told in one line (their own fields would
# otherwise come back as a list of unknown fields): a title, and what their top-level mapping holds.
FOREIGN_FORMATS: Final[tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...]] = (
    ("a Kubernetes manifest", lambda doc: "apiVersion" in doc and "kind" in doc),
    (
        "a SkyPilot task YAML",
        lambda doc: "run" in doc and "workers" not in doc and not job_launch.is_launch(doc),
    ),
)


def detect(doc: Mapping[str, Any]) -> SpecFormat:
    """Which format a spec's top-level mapping is written in."""
    for title, looks_like in FOREIGN_FORMATS:
        if looks_like(doc):
            *others, last = FORMAT_TITLES.values()
            readable = f"{', '.join(others)} or {last}"
            raise SpecError(
                [f"this is {title}, which rigbase does not read: give {readable} (docs/job-spec.md)"]
            )
    if "protocolVersion" in doc:
        raise SpecError(
            [
                "protocolVersion: OpenPAI's protocol v2 (YAML) is not read; "
                "give the v1 job JSON (jobName, image, taskRoles)"
            ]
        )
    if job_openpai.is_openpai(doc):
        return SpecFormat.OPENPAI
    if job_launch.is_launch(doc):
        return SpecFormat.LAUNCH
    if job_trainml.is_trainml(doc):
        return SpecFormat.TRAINML
    return SpecFormat.RIGBASE


def read(text: str, filename: str | None = None) -> ParsedSpec:
    """The JobSpec a file's text describes, its format and the conversion's notes; SpecError otherwise."""
    source = load(text, filename)
    fmt = detect(source.data)
    converted: Converted | None = None
    try:
        if fmt is SpecFormat.LAUNCH:
            converted = job_launch.to_rigbase(source.data, filename)
        elif fmt is SpecFormat.OPENPAI:
            converted = job_openpai.to_rigbase(source.data)
        elif fmt is SpecFormat.TRAINML:
            converted = job_trainml.to_rigbase(source.data)
    except RuleErrors as exc:  # the foreign file's own fields are wrong: name them as written
        raise SpecError(_lines(exc.errors, source, filename)) from None
    data = converted.data if converted else source.data
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = spec_errors(exc)
        if converted is not None:
            errors = [_as_written(path, message, converted) for path, message in errors]
        raise SpecError(_lines(errors, source, filename)) from None
    return ParsedSpec(spec=spec, format=fmt, notes=converted.notes if converted else [])


def parse(text: str, filename: str | None = None) -> JobSpec:
    return read(text, filename).spec


def dump(spec: JobSpec, *, as_json: bool = False) -> str:
    """The spec as rigbase YAML (multi-line commands as literal blocks) or JSON; `parse` reads it back."""
    data = _pruned(spec.model_dump(mode="json", exclude_none=True))
    if as_json:
        return json.dumps(data, indent=2) + "\n"
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def convert(text: str, filename: str | None = None, *, as_json: bool = False) -> str:
    """`provision job convert`: the rigbase spec a file becomes; YAML starts with comments saying what the
    conversion changed."""
    parsed = read(text, filename)
    body = dump(parsed.spec, as_json=as_json)
    if as_json or parsed.format is SpecFormat.RIGBASE:
        return body
    header = [f"# converted from {FORMAT_TITLES[parsed.format]}"] + [f"# - {note}" for note in parsed.notes]
    return "\n".join(header) + "\n" + body


def _pruned(data: dict[str, Any]) -> dict[str, Any]:
    """Without empty lists and mappings (their defaults), so a converted spec shows only what it sets."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            value = _pruned(value)
        if value not in ({}, []):
            out[key] = value
    return out


def _as_written(path: FieldPath, message: str, converted: Converted) -> tuple[FieldPath, str]:
    """A rigbase field's error on the source field it came from, with the rigbase name kept in the text."""
    source_path = converted.source_path(path)
    if source_path is None or source_path == path:
        return path, message
    return source_path, f"{message} (as {format_path(path)})"


def _lines(errors: list[tuple[FieldPath, str]], source: Source, filename: str | None) -> list[str]:
    """One line per error, in the order of the file (missing top-level fields, which have no line, first)."""
    errors = sorted(errors, key=lambda error: source.line_of(error[0]) or 0)
    return [
        f"{where(filename, source.line_of(path))}{format_path(path) or 'spec'}: {message}"
        for path, message in errors
    ]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
