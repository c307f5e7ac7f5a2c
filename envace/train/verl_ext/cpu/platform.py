"""verl's side of the CPU support: the ``"cpu"`` platform and torch shims (see
:mod:`envace.train.verl_ext.cpu`).

Imported through ``VERL_USE_EXTERNAL_MODULES`` (first in the list), i.e. from inside ``import verl``;
registers :class:`PlatformCPU` and, when ``VERL_PLATFORM=cpu``, applies :func:`install`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from envace.train.verl_ext.cpu import check_versions

__all__ = ["PlatformCPU", "install"]

check_versions(("verl",))

from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's device interface on a CPU (see the module docstring)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> torch.device:
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # fake GPUs: ray.init(num_gpus=N), see the module docstring

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _patch_torch_cpu() -> None:
    """``torch.cpu`` stand-ins for the ``torch.cuda`` calls verl makes through ``get_torch_device()``."""
    stand_ins: dict[str, Any] = {
        "empty_cache": lambda: None,
        "ipc_collect": lambda: None,
        "memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "max_memory_reserved": lambda *a, **k: 0,
        "reset_peak_memory_stats": lambda *a, **k: None,
        "mem_get_info": lambda *a, **k: _mem_info(),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "is_initialized": lambda: True,
    }
    for name, fn in stand_ins.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def _mem_info() -> tuple[int, int]:
    """``(free, total)`` bytes of host memory, as ``torch.cuda.mem_get_info`` reports device memory."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _collapse_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` -> ``"gloo"``; anything else unchanged."""
    if isinstance(backend, str) and "," in backend:
        kinds = {part.split(":")[-1] for part in backend.split(",")}
        if kinds == {"gloo"}:
            return "gloo"
    return backend


def _patch_gloo_backend() -> None:
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_envace_cpu", False):
        return
    init_pg, new_group = dist.init_process_group, dist.new_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_collapse_backend(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _collapse_backend(kwargs["backend"])
        return init_pg(*args, **kwargs)

    def new_group_(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _collapse_backend(kwargs["backend"])
        return new_group(*args, **kwargs)

    init_process_group._envace_cpu = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.new_group = new_group_


def install() -> bool:
    """Apply the torch shims when this process runs verl on the CPU platform; returns whether it did."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return False
    _patch_torch_cpu()
    _patch_gloo_backend()
    return True


install()
