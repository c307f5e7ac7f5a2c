"""vLLM's side of the CPU support: the ``vllm.general_plugins`` entry point (see
:mod:`envace.train.verl_ext.cpu`).

Imports neither verl nor envace's trainer modules: vLLM loads general plugins in every vLLM process,
including verl's rollout engine processes, before anything imports verl.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from envace.train.verl_ext.cpu import check_versions

__all__ = ["register"]


def register() -> None:
    """vLLM general plugin: keep unquantized linear weights reloadable on vLLM's CPU backend.

    Loaded by vLLM in every process (entry point group ``vllm.general_plugins``); a no-op unless vLLM's
    platform is the CPU and this is a verl rollout server on verl's CPU platform (``VERL_PLATFORM=cpu``,
    which the launcher sets and the rollout servers inherit); evaluation servers keep vLLM's faster
    prepacked weights. Refuses (:class:`UnsupportedVersion`) another vLLM than the pinned one.
    """
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return  # not a verl rollout on the CPU platform (e.g. `vllm serve` for evaluation): keep prepacking
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    check_versions(("vllm",))
    import vllm.model_executor.layers.utils as layer_utils

    if getattr(layer_utils, "_envace_reloadable", False):
        return
    prepack = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: Any, remove_weight: bool) -> Any:
        weight = getattr(layer, "weight", None)
        if remove_weight and weight is not None and weight.ndim == 2:
            layer.cpu_linear = lambda x, w, b: torch.nn.functional.linear(x, w, b)
            return None
        return prepack(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
    layer_utils._envace_reloadable = True
