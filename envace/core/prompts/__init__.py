"""Versioned prompt files shipped with the package (``envace/core/prompts/<name>.yaml``).

Each file is a YAML mapping with a ``version`` field equal to its file stem plus string fields; the
loader checks both and returns the mapping. The prompt text lives only in these files so that a
result can record exactly which prompt produced it.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

__all__ = ["load_prompt"]


def load_prompt(name: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load ``envace/core/prompts/<name>.yaml``.

    Args:
        name: file stem, e.g. ``"rehearsal_v1"``.
        required: string fields that must be present.

    Raises:
        FileNotFoundError: no such prompt file.
        ValueError: ``version`` differs from ``name``, or a required field is missing or not a string.
    """
    path = resources.files(__name__).joinpath(f"{name}.yaml")
    if not path.is_file():
        raise FileNotFoundError(f"no prompt file {name}.yaml in envace/core/prompts")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("version") != name:
        raise ValueError(f"prompt file {name}.yaml must be a mapping with version: {name}")
    missing = [key for key in required if not isinstance(data.get(key), str)]
    if missing:
        raise ValueError(f"prompt file {name}.yaml lacks string fields {missing}")
    return data
