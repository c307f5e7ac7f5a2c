"""Shared fixtures for the training tests: the CM2 fixture examples (converted with the tiny ``tokenizer``
of ``tests/fixtures.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.train.data import convert

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "cm2_fixture.jsonl"


@pytest.fixture(scope="session")
def converted(tokenizer):
    return convert(str(FIXTURE), tokenizer, 3500)
