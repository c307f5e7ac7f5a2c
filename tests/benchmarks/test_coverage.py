"""Every script in ``benchmarks/`` has a quick run here, or in the test named for it below."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
#: scripts whose checks run on hand-made outputs in another test folder
ELSEWHERE = {"check_smoke_training": "tests/train/test_check_smoke_training.py",
             "faults": "tests/train/test_faults.py"}


def test_every_script_is_run_by_a_test() -> None:
    root = HERE.parents[1]
    scripts = {path.stem for path in (root / "benchmarks").glob("*.py")}
    tested = {path.stem.removeprefix("test_") for path in HERE.glob("test_*.py")}
    assert all((root / test).is_file() for test in ELSEWHERE.values())
    assert scripts - tested - set(ELSEWHERE) == set(), "benchmarks/ scripts without a test"
