"""A job spec file's text as data, with the line of every field (for error lines).

YAML is read with PyYAML's composer, whose nodes carry marks: walking the node tree maps each field path to
the line where it is written. JSON is YAML too; text that is JSON but not YAML (tabs in odd places) falls back
to the json module, without lines. Refused with one line each: text over MAX_SPEC_BYTES, more than one
document, a key given twice (YAML would silently keep the last), anchors and aliases (a few lines of aliases
can expand to gigabytes when walked), and a top level that is not a mapping."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from contracts.jobspec import FieldPath, SpecError, format_path

MAX_SPEC_BYTES: Final = 1024 * 1024


@dataclass(frozen=True)
class Source:
    """Parsed data and the 1-based line of each field path (mapping keys as strings, list items as ints)."""

    data: dict[str, Any]
    lines: dict[FieldPath, int] = field(default_factory=dict)

    def line_of(self, path: FieldPath) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        parts: FieldPath = tuple(p if isinstance(p, int) else str(p) for p in path)
        for end in range(len(parts), 0, -1):
            line = self.lines.get(parts[:end])
            if line is not None:
                return line
        return None


@dataclass(frozen=True)
class Converted:
    """A foreign spec turned into rigbase spec data. `origin` maps a rigbase field path (or a prefix of one)
    to the source field it came from, so a rigbase rule's error names the field the user wrote; `notes` say
    what the conversion dropped or changed."""

    data: dict[str, Any]
    origin: dict[FieldPath, FieldPath]
    notes: list[str]

    def source_path(self, path: FieldPath) -> FieldPath | None:
        for end in range(len(path), 0, -1):
            if path[:end] in self.origin:
                return self.origin[path[:end]] + path[end:]
        return None


def where(filename: str | None, line: int | None) -> str:
    """The location prefix of an error line: "job.yaml:12: ", "line 12: " or nothing."""
    if line is None:
        return ""
    return f"{filename}:{line}: " if filename else f"line {line}: "


def load(text: str, filename: str | None = None) -> Source:
    """The spec file's top-level mapping and its line map; SpecError saying what to fix otherwise."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError([f"the spec is larger than {MAX_SPEC_BYTES // 1024} KiB: a job spec is a few lines"])
    try:
        try:
            source = _load_yaml(text, filename)
        except yaml.YAMLError as exc:
            source = _load_json(text, filename, exc)
    except RecursionError:  # both parsers recurse per level: `[[[[…` a million deep must not crash the caller
        raise SpecError(["the spec is nested too deeply: a job spec is a few levels of fields"]) from None
    if not isinstance(source.data, dict):
        raise SpecError(
            ["the spec must be a mapping of fields (name, resources, workers, …), not a list or text"]
        )
    return source


def _load_yaml(text: str, filename: str | None) -> Source:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SpecError(["the spec is empty: give at least name, resources and workers"])
        lines: dict[FieldPath, int] = {}
        _walk(node, (), lines, set(), filename)
        data = loader.construct_document(node)
    finally:
        loader.dispose()
    return Source(data=data, lines=lines)


def _walk(
    node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int], seen: set[int], filename: str | None
) -> None:
    if id(node) in seen:  # the composer hands out the anchored node again for every alias
        line = node.start_mark.line + 1
        raise SpecError(
            [f"{where(filename, line)}{format_path(path)}: anchors and aliases (&, *) are not supported"]
        )
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in keys:
                twice = f"{format_path((*path, key))}: given twice (first on line {keys[key]})"
                raise SpecError([f"{where(filename, line)}{twice}"])
            keys[key] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, seen, filename)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), lines, seen, filename)


def _load_json(text: str, filename: str | None, yaml_error: yaml.YAMLError) -> Source:
    if text.lstrip().startswith(("{", "[")):
        try:
            return Source(data=json.loads(text, object_pairs_hook=_unique_keys))
        except json.JSONDecodeError as exc:
            if "//" in text or "/*" in text:  # JSON with comments, as OpenPAI's portal reads it
                return _load_commented_json(text, filename, exc)
            raise SpecError([f"{where(filename, exc.lineno)}not valid JSON: {exc.msg}"]) from None
    mark = getattr(yaml_error, "problem_mark", None)
    problem = getattr(yaml_error, "problem", None) or str(yaml_error).splitlines()[0]
    line = mark.line + 1 if mark is not None else None
    raise SpecError([f"{where(filename, line)}not valid YAML: {problem}"]) from None


def _load_commented_json(text: str, filename: str | None, error: json.JSONDecodeError) -> Source:
    """JSON with `//` and `/* */` comments (OpenPAI's portal strips them, then parses): read by json5."""
    import json5  # only for such files: its parser is slower than json's

    try:
        return Source(data=json5.loads(text, object_pairs_hook=lambda pairs: _unique_keys(list(pairs))))
    except ValueError:
        raise SpecError([f"{where(filename, error.lineno)}not valid JSON: {error.msg}"]) from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of two equal keys; a spec that gives one twice is refused instead."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SpecError([f"{key}: given twice in one object"])
        out[key] = value
    return out


def dns_name(raw: str, fallback: str = "job") -> str:
    """A foreign job name as a rigbase name (a DNS label): lower case, other characters as hyphens."""
    name = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:63].strip("-")
    return name or fallback
