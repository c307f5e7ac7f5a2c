"""Shared fixtures for the training tests: the tiny tokenizer and the CM2 fixture examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.data import convert
from envace.tiny_model import build_tiny_tokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "cm2_fixture.jsonl"


@pytest.fixture(scope="session")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def converted(tokenizer):
    return convert(str(FIXTURE), tokenizer, 3500)
