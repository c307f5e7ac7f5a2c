"""Typed settings read once from the validated config.

:class:`TTSSetting` is a test-time-scaling setting, the one place its id (``no_tts``,
``{mode}_n{N}_{rehearser}``, e.g. ``parallel_n2_envace``) is written and read. The config's rehearser
names cannot hold ``_`` (the schema's ``tts.rehearsers`` key pattern), so an id reads back one way. A
setting of the released-weights suite (the ``released`` config block: the authors' published
checkpoints in place of ours, as actor and as rehearser) carries the prefix ``released-``
(``released-parallel_n2_envace``, ``released-no_tts``).

:data:`EPISODE_DEFAULTS` are the training episode rules a run gets for a key its
``training.runs.<run>.episode`` block omits; they are read from the schema's ``x-default`` values
(``envace/schemas/config.schema.yaml``), so the documented default and the applied one are one value (an
``x-`` keyword: Snakemake's ``validate`` fills a plain ``default`` into the config, which would rewrite the
runs' spec files and re-train them).

:func:`config_schema` is the one reader of that schema (parsed once per process; the validator and the
defaults read the same object).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

TTSMode = Literal["parallel", "sequential"]
NO_TTS = "no_tts"
_ID = re.compile(r"(parallel|sequential)_n([1-9][0-9]*)_([a-z0-9]+)")
#: The TTS suites besides the paper's (``""``): ``released``, the released weights as actor and rehearser.
SUITES = ("released",)
SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"


@dataclass(frozen=True)
class TTSSetting:
    """One test-time-scaling setting: ``mode`` with ``n`` private rehearsals by ``rehearser`` (a key of
    ``tts.rehearsers``); ``mode=None`` is no test-time scaling (``no_tts``: one real episode). ``suite``:
    ``""`` (the paper's actor and rehearsers) or one of :data:`SUITES`."""

    mode: TTSMode | None = None
    n: int = 0
    rehearser: str = ""
    suite: str = ""

    @classmethod
    def parse(cls, setting: str) -> TTSSetting:
        """``"parallel_n2_envace"`` -> ``TTSSetting("parallel", 2, "envace")``; ``"no_tts"`` -> no TTS;
        ``"released-parallel_n2_envace"`` -> the same in the ``released`` suite. Raises ``ValueError``
        naming the id for anything else."""
        suite, sep, rest = setting.partition("-")
        if not sep:
            suite, rest = "", setting
        elif suite not in SUITES:
            raise ValueError(f"not a TTS setting id: {setting!r} (unknown suite {suite!r}; known: {SUITES})")
        if rest == NO_TTS:
            return cls(suite=suite)
        match = _ID.fullmatch(rest)
        if match is None:
            raise ValueError(f"not a TTS setting id: {setting!r} (expected [<suite>-]{NO_TTS} or "
                             "[<suite>-]{parallel|sequential}_n{N}_{rehearser}, rehearser in [a-z0-9]+)")
        return cls(match[1], int(match[2]), match[3], suite)  # type: ignore[arg-type]

    @property
    def is_tts(self) -> bool:
        """False for ``no_tts``."""
        return self.mode is not None

    def in_suite(self, suite: str) -> TTSSetting:
        """The same setting in ``suite`` (``""``: the paper's)."""
        return TTSSetting(self.mode, self.n, self.rehearser, suite)

    def __str__(self) -> str:
        base = f"{self.mode}_n{self.n}_{self.rehearser}" if self.is_tts else NO_TTS
        return f"{self.suite}-{base}" if self.suite else base


def tts_settings(tts: dict[str, Any], suite: str = "") -> list[TTSSetting]:
    """Every setting of a ``tts`` config block: no TTS, then mode x n x rehearser in config order (in
    ``suite``)."""
    return [TTSSetting(suite=suite)] + [TTSSetting(mode, int(n), rehearser, suite) for mode in tts["modes"]
                                        for n in tts["n"] for rehearser in tts["rehearsers"]]


@functools.cache
def config_schema() -> dict[str, Any]:
    """The config's JSON schema (``envace/schemas/config.schema.yaml``), parsed once; shared, so callers
    read it and never change it."""
    return yaml.safe_load(SCHEMA.read_text())


def _episode_defaults() -> dict[str, Any]:
    """The ``x-default`` of each property of ``training.runs.<run>.episode`` in the schema."""
    props = config_schema()["$defs"]["training_run"]["properties"]["episode"]["properties"]
    missing = sorted(k for k, p in props.items() if "x-default" not in p)
    if missing:
        raise RuntimeError(f"{SCHEMA}: training run episode keys without a default: {missing}")
    return {key: prop["x-default"] for key, prop in props.items()}


#: Training episode rules for keys a run's ``episode`` block omits (the schema's defaults).
EPISODE_DEFAULTS: dict[str, Any] = _episode_defaults()


def _training_value(training: dict[str, Any], key: str) -> Any:
    """``training.<key>``, else the schema's ``x-default`` for it."""
    if key in training:
        return training[key]
    return config_schema()["properties"]["training"]["properties"][key]["x-default"]


def training_loggers(training: dict[str, Any]) -> list[str]:
    """verl's ``trainer.logger`` for every run: ``training.loggers``, else the schema's ``x-default``."""
    return list(_training_value(training, "loggers"))


def step_timeout_s(training: dict[str, Any]) -> float:
    """``training.step_timeout_min`` in seconds, else the schema's ``x-default`` (0: the training driver
    runs unwatched; :mod:`envace.train.verl_ext.stall`)."""
    return 60.0 * float(_training_value(training, "step_timeout_min"))
