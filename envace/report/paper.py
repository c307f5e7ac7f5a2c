"""The paper's printed numbers (``paper_tables/paper_numbers.yaml``) and claim definitions
(``paper_tables/claims.yaml``).

The files are located through ``--paper`` or, by default, ``paper_tables/`` at the repository root (the
directory above the ``envace`` package), falling back to ``paper_tables/`` in the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SECTIONS = ("table1", "table2", "table3", "figure3", "figure4", "figure5", "figure6")


def default_paper_path() -> Path:
    """``paper_tables/paper_numbers.yaml`` at the repository root, else in the working directory."""
    candidate = Path(__file__).resolve().parents[2] / "paper_tables" / "paper_numbers.yaml"
    return candidate if candidate.exists() else Path("paper_tables") / "paper_numbers.yaml"


def load_paper(path: str | Path | None = None) -> dict[str, Any]:
    """Read the paper numbers; raises ValueError if a section or the claims list is absent."""
    path = Path(path) if path is not None else default_paper_path()
    data = yaml.safe_load(path.read_text())
    missing = [s for s in (*SECTIONS, "claims") if s not in data]
    if missing:
        raise ValueError(f"{path}: paper numbers lack sections {missing}")
    data["_path"] = str(path)
    return data


def load_claims(paper: dict[str, Any]) -> dict[str, Any]:
    """``claims.yaml`` beside the paper numbers: per claim id, what our check compares."""
    return yaml.safe_load((Path(paper["_path"]).parent / "claims.yaml").read_text())


def decimals(paper: dict[str, Any], section: str, column: str) -> int:
    """Printed precision of a paper cell (a per-column mapping or one number for the section)."""
    dec = paper[section].get("decimals", 1)
    return int(dec.get(column, 1)) if isinstance(dec, dict) else int(dec)
