"""envace.common.atomic: a file is replaced whole or left as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envace.common.atomic import atomic_write, atomic_write_json, atomic_write_text


def test_failed_write_leaves_old_content_and_no_temp(tmp_path: Path) -> None:
    path = atomic_write_text(tmp_path / "a.txt", "old\n")

    def half(tmp: str) -> None:
        Path(tmp).write_text("ne")
        raise KeyboardInterrupt  # an interrupt mid-write, not only an Exception

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_permissions_follow_the_umask_and_parents_are_made(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        import importlib

        import envace.common.atomic as mod

        importlib.reload(mod)  # the umask is read at import
        path = mod.atomic_write_text(tmp_path / "x" / "b.txt", "t", parents=True)
    finally:
        os.umask(old)
        importlib.reload(mod)
    assert path.read_text() == "t" and path.stat().st_mode & 0o777 == 0o640


def test_json_form(tmp_path: Path) -> None:
    path = atomic_write_json(tmp_path / "c.json", {"b": 1, "a": [1.5]}, sort_keys=True, end="")
    assert path.read_text() == '{"a": [1.5], "b": 1}' and json.loads(path.read_text()) == {"a": [1.5], "b": 1}
