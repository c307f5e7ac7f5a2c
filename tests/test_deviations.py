"""``docs/deviations.md`` stays true: one row per deviation switch of the config schema, and back.

A switch is a schema property carrying ``x-deviation: <id>`` (``workflow/schemas/config.schema.yaml``):
a rule where the paper is silent or where we differ from the authors' release. Each must have a row in
the table of ``docs/deviations.md`` whose ``id`` column is that id, whose ``Switch`` column names the
property's config key (``<name>`` stands for any key of a map, e.g. ``training.runs.<run>``), and whose
``Default`` column is the value ``config/config.yaml`` sets there (a backticked YAML value). A row
without a switch, a switch without a row, or a default the config does not have fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures import config_values, markdown_table

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
DOC = ROOT / "docs" / "deviations.md"
CONFIG = ROOT / "config" / "config.yaml"
COLUMNS = ["id", "Rule", "Paper", "Authors' code", "Default", "Switch", "Why"]


def _resolve(node: Any, schema: dict[str, Any]) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = schema["$defs"][ref.split("/")[-1]]
    return node


def schema_switches(schema: dict[str, Any]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(id, key path)`` of every ``x-deviation`` property; ``*`` stands for any key of a map."""

    def walk(node: Any, path: tuple[str, ...], seen: frozenset[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
        if isinstance(node, dict) and "$ref" in node:
            if node["$ref"] in seen:
                return
            seen = seen | {node["$ref"]}
        node = _resolve(node, schema)
        if not isinstance(node, dict):
            return
        if "x-deviation" in node:
            yield str(node["x-deviation"]), path
        for key, sub in (node.get("properties") or {}).items():
            yield from walk(sub, (*path, key), seen)
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], (*path, "*"), seen)
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key) or []:
                yield from walk(sub, path, seen)

    yield from walk(schema, (), frozenset())


def doc_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header is :data:`COLUMNS`."""
    return markdown_table(text, COLUMNS, "docs/deviations.md")


def _code(cell: str) -> str:
    m = re.fullmatch(r"`([^`]+)`", cell)
    assert m, f"expected one backticked value, got {cell!r}"
    return m.group(1)


def _matches(doc_path: tuple[str, ...], schema_path: tuple[str, ...]) -> bool:
    return len(doc_path) == len(schema_path) and all(
        s == "*" or d == s for d, s in zip(doc_path, schema_path, strict=True))


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return doc_rows(DOC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def switches() -> dict[str, list[tuple[str, ...]]]:
    out: dict[str, list[tuple[str, ...]]] = {}
    for ident, path in schema_switches(yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))):
        out.setdefault(ident, []).append(path)
    return out


def test_every_switch_has_a_row_and_every_row_a_switch(rows, switches) -> None:
    ids = [_code(r["id"]) for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate ids in docs/deviations.md: {ids}"
    assert switches, "the schema marks no deviation switch (x-deviation)"
    assert sorted(set(ids) - set(switches)) == [], "rows without a switch in the schema"
    assert sorted(set(switches) - set(ids)) == [], "switches without a row in docs/deviations.md"


def test_each_row_names_its_switch_and_the_configs_default(rows, switches) -> None:
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    for row in rows:
        ident, key = _code(row["id"]), _code(row["Switch"])
        doc_path = tuple(key.split("."))
        assert any(_matches(doc_path, p) for p in switches.get(ident, [])), (
            f"row {ident}: switch {key} is not where the schema marks {ident}: {switches.get(ident)}")
        values = config_values(cfg, doc_path)
        assert values, f"row {ident}: config/config.yaml has no {key}"
        default = yaml.safe_load(_code(row["Default"]))
        assert all(v == default for v in values), f"row {ident}: config/config.yaml sets {key} to {values}"
        for column in ("Rule", "Authors' code", "Why"):
            assert row[column], f"row {ident}: empty column {column!r}"


def test_the_checker_catches_a_missing_row() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "boolean", "x-deviation": "one"}}}, "m": {"type": "object", "additionalProperties": {
            "$ref": "#/$defs/run"}}}, "$defs": {"run": {"type": "object", "properties": {
                "c": {"type": "string", "x-deviation": "two"}}}}}
    assert sorted(schema_switches(schema)) == [("one", ("a", "b")), ("two", ("m", "*", "c"))]
    table = "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
                       "| `one` | r | p | f | `true` | `a.b` | w |"])
    assert [_code(r["id"]) for r in doc_rows(table)] == ["one"]  # "two" lacks a row: the first test fails
    assert config_values({"m": {"x": {"c": 1}, "y": {"c": 2}}}, ("m", "<run>", "c")) == [1, 2]
    assert _matches(("m", "envace_8b", "c"), ("m", "*", "c")) and not _matches(("m", "c"), ("m", "*", "c"))
