"""``docs/authors_scripts.md`` stays true: the authors' launch-script values against ``config/config.yaml``.

The page has two tables: every ``key=value`` / ``+key=value`` override of the authors' three launch
scripts (``examples/drmas_trainer/run_checklist_{share,noshare,caller_only}.sh`` at commit 173e941), and
the defaults of the authors' verl that our config cites. A ``SAME`` or ``SWITCH`` row that names config
keys must hold the values ``config/config.yaml`` sets there, and the schema's description of such a key
must not call a value the authors' script sets "our choice". No model, no server: the tables and the
config only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.common.config import load_config, schema
from tests.fixtures import config_values, markdown_table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "authors_scripts.md"
DEVIATIONS = ROOT / "docs" / "deviations.md"
CONFIG = ROOT / "config" / "config.yaml"

SCRIPT_COLUMNS = ["#", "Script key", "share", "noshare", "caller_only", "Our key", "Ours", "Status", "Notes"]
VERL_COLUMNS = ["#", "verl key", "Authors' verl default", "Our key", "Ours", "Status", "Notes"]
STATUSES = {"SAME", "SWITCH", "DIFFERENT", "N/A"}

#: The override lines of ``verl.trainer.main_ppo`` in each script at commit 173e941 (share and noshare
#: are line for line the same; caller_only has three more, the external simulator's).
SCRIPT_LINES = {"share": set(range(125, 225)), "noshare": set(range(125, 225)),
                "caller_only": set(range(130, 233))}


def table(text: str, columns: list[str]) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header is ``columns``."""
    return markdown_table(text, columns, "docs/authors_scripts.md")


def statuses(cell: str) -> set[str]:
    found = set(re.findall(r"SAME|SWITCH|DIFFERENT|N/A", cell))
    leftover = re.sub(r"SAME|SWITCH|DIFFERENT|N/A|\([^)]*\)|[;,\s]", "", cell)
    assert found and not leftover, f"status {cell!r}: use {sorted(STATUSES)}, optionally '(scripts)'"
    return found


def schema_node(sch: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    """The schema property at ``path`` (a run name or ``<run>`` goes through ``additionalProperties``)."""
    node: Any = sch
    for part in path:
        while isinstance(node, dict) and "$ref" in node:
            node = sch["$defs"][node["$ref"].split("/")[-1]]
        if not isinstance(node, dict):
            return None
        props = node.get("properties") or {}
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    while isinstance(node, dict) and "$ref" in node:
        node = sch["$defs"][node["$ref"].split("/")[-1]]
    return node if isinstance(node, dict) else None


def checked_rows(rows: list[dict[str, str]]) -> list[tuple[dict[str, str], list[str], list[str]]]:
    """``(row, keys, values)`` of every SAME / SWITCH row that names config keys."""
    out = []
    for row in rows:
        st = statuses(row["Status"])
        if "DIFFERENT" in st:
            assert row["Notes"], f"{row['#']}: a DIFFERENT row needs its reason in Notes"
        if not st & {"SAME", "SWITCH"}:
            continue
        key_cell = row["Our key"]
        if key_cell.startswith("code:"):
            continue
        assert key_cell not in ("", "—"), f"row {row['#']}: SAME/SWITCH needs a config key or 'code: ...'"
        keys = re.findall(r"`([^`]+)`", key_cell)
        values = re.findall(r"`([^`]+)`", row["Ours"])
        assert keys and len(values) in (1, len(keys)), f"row {row['#']}: keys {keys}, values {values}"
        out.append((row, keys, values * len(keys) if len(values) == 1 else values))
    return out


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rows(text: str) -> list[dict[str, str]]:
    return table(text, SCRIPT_COLUMNS) + table(text, VERL_COLUMNS)


def test_every_override_of_every_script_has_one_row(text: str) -> None:
    rows = table(text, SCRIPT_COLUMNS)
    keys = [r["Script key"] for r in rows]
    assert len(keys) == len(set(keys)), "a script key has two rows"
    for script, expected in SCRIPT_LINES.items():
        lines = [int(m.group(1)) for r in rows if (m := re.search(r":(\d+)", r[script]))]
        assert len(lines) == len(set(lines)), f"{script}: a line is cited twice"
        assert set(lines) == expected, (
            f"{script}: missing {sorted(expected - set(lines))}, extra {sorted(set(lines) - expected)}")


def test_same_and_switch_rows_hold_the_configs_values(rows: list[dict[str, str]]) -> None:
    cfg = load_config(str(CONFIG))
    checked = checked_rows(rows)
    assert checked, "no row names a config key"
    for row, keys, values in checked:
        for key, value in zip(keys, values, strict=True):
            got = config_values(cfg, key.split("."))
            name = row.get("Script key") or row.get("verl key")
            assert got, f"row {row['#']} ({name}): config/config.yaml has no {key}"
            want = yaml.safe_load(value)
            assert all(v == want for v in got), f"row {row['#']} ({name}): {key} is {got}, not {want!r}"


def test_schema_labels_of_the_authors_values(rows: list[dict[str, str]]) -> None:
    """A value the authors set (a SAME row) is not labelled as ours alone in the schema."""
    sch = schema()
    for row, keys, _ in checked_rows(rows):
        if "SAME" not in statuses(row["Status"]):
            continue
        for key in keys:
            node = schema_node(sch, key.split("."))
            assert node is not None, f"row {row['#']}: the schema has no {key}"
            desc = str(node.get("description", ""))
            if re.search(r"our choice|\bours\b", desc, re.IGNORECASE):
                assert re.search(r"authors'|paper", desc), f"row {row['#']}: {key} is labelled ours: {desc!r}"


def test_deviation_ids_exist_and_the_page_is_linked(text: str) -> None:
    deviations = DEVIATIONS.read_text(encoding="utf-8")
    assert "authors_scripts.md" in deviations, "docs/deviations.md does not link docs/authors_scripts.md"
    ids = set(re.findall(r"^\| `([a-z0-9-]+)` \|", deviations, re.MULTILINE))
    cited = set(re.findall(r"deviation `([a-z0-9-]+)`", text))
    assert cited and cited <= ids, f"unknown deviation ids: {sorted(cited - ids)}"


def test_the_checker_catches_a_wrong_value() -> None:
    doc = "\n".join(["| " + " | ".join(SCRIPT_COLUMNS) + " |", "|" + "---|" * len(SCRIPT_COLUMNS),
                     "| 1 | `a` | `1` :125 | `1` :125 | `1` :130 | `m.<run>.x` | `2` | SAME | |"])
    (row, keys, values), = checked_rows(table(doc, SCRIPT_COLUMNS))
    assert config_values({"m": {"r1": {"x": 2}, "r2": {"x": 3}}}, keys[0].split(".")) == [2, 3]  # 3 fails
    assert values == ["2"] and statuses("SAME (share); DIFFERENT (caller_only)") == {"SAME", "DIFFERENT"}
    with pytest.raises(AssertionError):
        statuses("MAYBE")
