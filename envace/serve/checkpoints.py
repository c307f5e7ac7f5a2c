"""Where a training run's checkpoint keeps an HF model: the layouts verl and others write.

``<dir>/step<N>`` / ``<dir>/step_<N>`` / ``<dir>/global_step_<N>``, each either an HF model directory or
holding one under ``huggingface/`` or ``actor/huggingface/`` (verl's ``save_contents`` with ``hf_model``).
Used by ``envace eval`` and ``envace fidelity`` to serve a trained model.
"""

from __future__ import annotations

import re
from pathlib import Path


def resolve_checkpoint(ckpt_dir: str | Path, step: int | None) -> Path:
    """The HF model directory of ``step`` (default: the highest) under ``ckpt_dir``."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {root} does not exist")
    found: dict[int, Path] = {}
    for child in root.iterdir():
        m = re.fullmatch(r"(?:global_step_|step_?)(\d+)", child.name)
        if m and child.is_dir():
            found[int(m.group(1))] = child
    if not found:
        raise FileNotFoundError(f"no step<N>/global_step_<N> checkpoints in {root}")
    chosen = max(found) if step is None else step
    if chosen not in found:
        raise FileNotFoundError(f"checkpoint step {chosen} not in {root} (have {sorted(found)})")
    for sub in ("", "huggingface", "actor/huggingface"):
        path = found[chosen] / sub
        if (path / "config.json").exists():
            return path
    raise FileNotFoundError(f"{found[chosen]}: no HF model (config.json) in it or its huggingface/ folder")
