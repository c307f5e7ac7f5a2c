"""Fixtures for the quick runs of the scripts in ``benchmarks/`` (not a package): ``script(name)`` loads
``benchmarks/<name>.py`` as a module, once per session; ``tiny_model_dir`` is the untrained tiny model saved
with its tokenizer (:func:`envace.serve.tiny_model.build_tiny_model`, as ``benchmarks/bench_eval.py`` builds
it), for the scripts that load a model folder."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"benchmarks/{name}.py not found"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script() -> Callable[[str], ModuleType]:
    """``script("bench_dag")``: the module of ``benchmarks/bench_dag.py``."""
    return functools.cache(_load)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untrained tiny model (seed 0) and its tokenizer in a folder."""
    from envace.serve.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("bench_tiny") / "tiny")


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Torch on one thread, whatever a script pins (two, for its measurements): these runs check that
    the scripts work, and two OpenMP threads on two cores that other processes share spin-wait each other
    (a quick run took 86 s instead of 3 s beside a smoke DAG)."""
    import torch

    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    set_threads(1)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    yield
    set_threads(threads)
