"""BFCL-v4 memory (``memory_kv``, ``memory_vector``, ``memory_rec_sum``): bfcl-eval's own memory backends,
one instance per episode, chained through snapshot files as bfcl-eval chains them.

How bfcl-eval 2026.3.23 runs a memory category (``bfcl_eval/utils.py`` ``process_memory_test_case``,
``model_handler/base_handler.py``): per scenario (customer, finance, ...) a chain of prerequisite
conversations (``data/memory_prereq_conversation``) runs first, in order, with the model under test; each
starts from the memory the previous one left (``MemoryAPI._prepare_snapshot`` loads
``<scenario>_final.json``; the first of a chain starts empty) and ends with
``_flush_memory_to_local_file``; then every question of the scenario runs from the chain's final memory,
which it does not write back. The agent's system prompt holds the scenario's setting and the memory's
current core content (``add_memory_instruction_system_prompt``).

Implemented here:
- :class:`SnapshotStore`: where a run keeps the chain's snapshots, one file per finished prerequisite
  conversation, ``<root>/seed<seed>/sample<k>/<category>/<entry id>.json`` (written atomically). A chain
  per (seed, sample): sample ``k`` of a question reads the memory that sample ``k`` of the chain wrote,
  so every sample is one independent bfcl-eval run.
- Per-episode isolation: each episode gets a fresh temporary ``model_result_dir``; the snapshot it must
  start from (its predecessor's, or the chain's last for a question) is copied to the path bfcl-eval's
  ``_prepare_snapshot`` reads, and bfcl-eval's own ``_load_scenario`` loads it. Nothing is shared between
  episodes but the store's finished files.
- :func:`memory_system_prompt`: bfcl-eval's system prompt, composed from its own constants
  (``MEMORY_AGENT_SETTINGS``, ``MEMORY_BACKEND_INSTRUCTION_UNIFIED`` for ``rec_sum``, else
  ``..._CORE_ARCHIVAL``; prepended to an existing system message with a blank line). Not called through
  bfcl-eval's function because its module imports tree-sitter at import time (a test compares the two).
- :func:`memory_backend_class`: the backend class; for ``memory_vector`` the module is imported with the
  configured encoder in place of its import-time ``SentenceTransformer("all-MiniLM-L6-v2")`` (a
  download): :func:`load_encoder` gives a ``sentence_transformers`` model from a local path or hub id, or
  ``hashing[:dim]``, :class:`HashingEncoder`, a deterministic encoder built in-process (smoke scale,
  tests: no download). One encoder per process (bfcl-eval's module holds it in a global); asking for
  another afterwards is an error.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from envace.common.atomic import atomic_write_text

__all__ = ["SnapshotStore", "memory_system_prompt", "memory_backend_class", "load_encoder", "HashingEncoder",
           "BACKEND_CLASSES", "snapshot_target"]

#: memory category -> bfcl-eval backend class name (``MemoryAPI_<backend>``).
BACKEND_CLASSES = {"memory_kv": "MemoryAPI_kv", "memory_vector": "MemoryAPI_vector",
                   "memory_rec_sum": "MemoryAPI_rec_sum"}
_VECTOR_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_vector"
_encoder_spec: str | None = None


class HashingEncoder:
    """A deterministic bag-of-words encoder (feature hashing): each lower-cased word adds ±1 at the index
    its BLAKE2b hash picks; the interface ``memory_vector`` uses of a ``SentenceTransformer``.
    Not a semantic model: it stands in for one at smoke scale and in tests."""

    def __init__(self, dim: int = 64) -> None:
        self.dim = int(dim)

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, sentences: str | list[str], normalize_embeddings: bool = False, **_: Any) -> np.ndarray:
        """``(n, dim)`` float32 embeddings of ``n`` sentences (``(dim,)`` for one string)."""
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in str(text).lower().split():
                digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if value >> 63 else -1.0
        if normalize_embeddings:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out = out / np.where(norms > 0, norms, 1.0)
        return out[0] if single else out


def load_encoder(spec: str, device: str = "cpu") -> Any:
    """``hashing`` / ``hashing:<dim>`` -> :class:`HashingEncoder`; else a ``SentenceTransformer`` loaded
    from ``spec`` (a local folder or a hub id; on the cluster, bfcl-eval's ``all-MiniLM-L6-v2``)."""
    name, _, dim = spec.partition(":")
    if name == "hashing":
        try:
            return HashingEncoder(int(dim) if dim else 64)
        except ValueError as exc:
            raise ValueError(f"benchmarks.bfcl_v4.memory.encoder: bad dimension in {spec!r}") from exc
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(spec, device=device)


def _import_vector_module(spec: str, device: str) -> Any:
    """Import bfcl-eval's ``memory_vector`` with ``spec``'s encoder as its module-global ``ENCODER``."""
    global _encoder_spec
    if _VECTOR_MODULE in sys.modules:
        if _encoder_spec is None:
            raise RuntimeError(f"{_VECTOR_MODULE} was imported before envace set its encoder: it holds "
                               "bfcl-eval's default model; import envace's memory backends first")
        if _encoder_spec != spec:
            raise RuntimeError(f"benchmarks.bfcl_v4.memory.encoder: this process already uses encoder "
                               f"{_encoder_spec!r} (bfcl-eval keeps one global encoder); got {spec!r}")
        return sys.modules[_VECTOR_MODULE]
    encoder = load_encoder(spec, device)
    # bfcl-eval imports sentence_transformers before faiss on purpose (OpenMP runtimes); keep that order
    import sentence_transformers

    original = sentence_transformers.SentenceTransformer
    sentence_transformers.SentenceTransformer = lambda *args, **kwargs: encoder  # its import-time model
    try:
        module = importlib.import_module(_VECTOR_MODULE)
    finally:
        sentence_transformers.SentenceTransformer = original
    _encoder_spec = spec
    return module


@cache
def memory_backend_class(category: str, encoder: str = "hashing", device: str = "cpu") -> type:
    """bfcl-eval's backend class of ``category`` (``memory_vector``: with ``encoder``, see above)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    name = BACKEND_CLASSES[category]
    if category == "memory_vector":
        return getattr(_import_vector_module(encoder, device), name)
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


def memory_system_prompt(category: str, scenario: str, instance: Any, existing: str | None) -> str:
    """bfcl-eval's memory system prompt for ``instance``'s current memory (see the module docstring)."""
    from bfcl_eval.constants.default_prompts import (
        MEMORY_AGENT_SETTINGS,
        MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL,
        MEMORY_BACKEND_INSTRUCTION_UNIFIED,
    )

    template = MEMORY_BACKEND_INSTRUCTION_UNIFIED if "rec_sum" in category else \
        MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL
    prompt = template.format(scenario_setting=MEMORY_AGENT_SETTINGS[scenario],
                             memory_content=instance._dump_core_memory_to_context())
    return prompt + "\n\n" + existing if existing else prompt


def snapshot_target(model_result_dir: Path, test_id: str, scenario: str) -> Path:
    """Where bfcl-eval's ``_prepare_snapshot`` reads the memory an episode starts from."""
    from bfcl_eval.utils import get_directory_structure_by_id

    return model_result_dir / get_directory_structure_by_id(test_id) / "memory_snapshot" / \
        f"{scenario}_final.json"


class SnapshotStore:
    """The finished prerequisite snapshots of a run (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, seed: int, sample: int, category: str, entry_id: str) -> Path:
        return self.root / f"seed{seed}" / f"sample{sample}" / category / f"{entry_id}.json"

    def save(self, seed: int, sample: int, category: str, entry_id: str, source: Path) -> Path:
        """Store the snapshot file ``source`` (bfcl-eval's flush output) for ``entry_id``."""
        target = self.path(seed, sample, category, entry_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        json.loads(source.read_text(encoding="utf-8"))  # a readable snapshot, or raise
        atomic_write_text(target, source.read_text(encoding="utf-8"))
        return target

    def drop(self, seed: int, sample: int, category: str, entry_id: str) -> None:
        """Forget ``entry_id``'s snapshot (a prerequisite about to run again must not leave a stale one)."""
        self.path(seed, sample, category, entry_id).unlink(missing_ok=True)

    def place(self, seed: int, sample: int, category: str, entry_id: str | None, target: Path) -> bool:
        """Copy ``entry_id``'s snapshot to ``target``; ``False`` when there is none to start from."""
        if entry_id is None:
            return True
        source = self.path(seed, sample, category, entry_id)
        if not source.exists():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return True
