"""Per-role policy: config composition, GPU split, role routing in the agent loop, batch split, paths."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from envace.common.config import load_config
from envace.core.rollout import Mode, RolloutConfig, run_rollout
from envace.core.tools import ToolCall, render_tool_call
from envace.serve.tiny_model import build_tiny_tokenizer
from envace.train.verl_ext.advantage import ESTIMATOR, role_group_ids
from envace.train.verl_ext.agent_loop import EnvaceAgentLoop, role_backends, trajectory_outputs
from envace.train.verl_ext.compose import compose, run_overrides
from envace.train.verl_ext.per_role import (
    RoleRoutingClient,
    check_per_role_config,
    rehearse_checkpoint_dir,
    resume_step_dir,
    role_row_indices,
    split_batch_by_role,
    split_nodes,
)
from tests.fixtures import WEATHER_TOOL as TOOL
from tests.fixtures import ScriptedServerManager

CFG = load_config("config/config.yaml")
TASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def per_role_cfg():
    return compose("per_role_8b", run_overrides(CFG, "per_role_8b", "/ck/per_role_8b", "/d/t.parquet"))


# ---------------------------------------------------------------- composition


def test_per_role_config_paper_values_and_second_policy(per_role_cfg):
    c, r = per_role_cfg, CFG["training"]["runs"]["per_role_8b"]
    a, ro = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    # paper values, identical to the shared run (one set of hyperparameters for both policies)
    assert c.actor_rollout_ref.model.path == "Qwen/Qwen3-8B" == r["base_model"]
    assert a.optim.lr == pytest.approx(1e-6) and c.data.train_batch_size == 16 and ro.n == 4
    assert c.trainer.total_training_steps == 470 and c.envace.max_turns == 30
    assert c.algorithm.adv_estimator == "envace_role_wise" and c.algorithm.norm_adv_by_std_in_grpo is False
    # the per-role settings
    assert c.envace.roles == "per_role" and c.envace.mode == "rehearsal"
    assert c.trainer.v1.trainer_mode == "envace_per_role_sync"
    assert ro.agent.default_agent_loop == "envace_rehearsal"
    # the second policy's pool + the ACT pool = exactly the GPUs config.yaml reserves, half each
    act = c.trainer.nnodes * c.trainer.n_gpus_per_node
    reh = c.envace.per_role.rehearse_nnodes * c.envace.per_role.rehearse_n_gpus_per_node
    assert act == reh and act + reh == r["nodes"] * r["gpus_per_node"]
    check_per_role_config(c)  # accepted


def test_shared_runs_have_no_second_policy():
    c = compose("envace_8b", run_overrides(CFG, "envace_8b"))
    assert "per_role" not in c.envace and c.trainer.v1.trainer_mode == "envace_sync"
    with pytest.raises(ValueError, match="envace.roles must be per_role"):
        check_per_role_config(c)


def test_check_per_role_config_refuses(per_role_cfg):
    bad = OmegaConf.create(OmegaConf.to_container(per_role_cfg))
    bad.envace.mode = "external_simulator"
    bad.actor_rollout_ref.model.lora_rank = 8
    bad.envace.per_role.rehearse_nnodes = 0
    bad.actor_rollout_ref.rollout.name = "sglang"
    bad.actor_rollout_ref.rollout.disaggregation.enabled = True
    with pytest.raises(ValueError) as err:
        check_per_role_config(bad)
    msg = str(err.value)
    assert "envace.mode must be rehearsal" in msg and "LoRA" in msg and "rehearse_nnodes" in msg
    assert "rollout.name must be vllm" in msg and "disaggregation" in msg


@pytest.mark.parametrize(
    ("nodes", "gpus", "expected"),
    [(2, 8, (1, 8, 1, 8)), (4, 8, (2, 8, 2, 8)), (1, 8, (1, 4, 1, 4)), (1, 2, (1, 1, 1, 1))],
)
def test_split_nodes(nodes, gpus, expected):
    s = split_nodes(nodes, gpus)
    got = (s["act_nnodes"], s["act_gpus_per_node"], s["rehearse_nnodes"], s["rehearse_gpus_per_node"])
    assert got == expected
    assert got[0] * got[1] + got[2] * got[3] == nodes * gpus


@pytest.mark.parametrize(("nodes", "gpus"), [(3, 8), (1, 1), (1, 3), (0, 8)])
def test_split_nodes_refuses_uneven(nodes, gpus):
    with pytest.raises(ValueError):
        split_nodes(nodes, gpus)


# ---------------------------------------------------------------- routing in the agent loop


def test_role_routing_sends_each_role_to_its_own_policy():
    tok = build_tiny_tokenizer()
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    act = ScriptedServerManager(tok, [call, call, "It is 4 degrees."])
    reh = ScriptedServerManager(tok, ['<execution_result>{"temp": 4}</execution_result>'] * 2)
    client = RoleRoutingClient({"act": act, "rehearse": reh})
    cfg = RolloutConfig(max_turns=5, act_sampling={"max_tokens": 64}, rehearse_sampling={"max_tokens": 64})
    policy, rehearser, run_cfg = role_backends(client, {"logprobs": True}, cfg)
    assert run_cfg.mode == Mode.EXTERNAL_SIMULATOR and cfg.mode == Mode.REHEARSAL  # input not mutated
    traj = asyncio.run(run_rollout(policy, tok, TASK, [TOOL], run_cfg, simulator=rehearser))
    assert [g.role for g in traj.generations] == ["act", "rehearse", "act", "rehearse", "act"]
    assert not act.texts and not reh.texts  # every scripted reply was consumed by its own role
    outs = trajectory_outputs(traj, 1.0, train_all=True)
    roles = [o.extra_fields["envace_role"] for o in outs]
    assert roles == ["act", "rehearse", "act", "rehearse", "act"]  # both policies' rows are trained
    act_rows = [o.prompt_ids for o in outs if o.extra_fields["envace_role"] == "act"]
    reh_rows = [o.prompt_ids for o in outs if o.extra_fields["envace_role"] == "rehearse"]
    # each row's prompt went to its role's server
    assert act_rows == act.prompt_ids and reh_rows == reh.prompt_ids
    assert len(trajectory_outputs(traj, 1.0)) == 3  # without train_all only ACT rows (the GRPO baseline)
    assert policy.request_id != rehearser.request_id


def test_agent_loop_per_role_branch(per_role_cfg):
    """EnvaceAgentLoop.run with envace.roles=per_role and a RoleRoutingClient as verl's server manager."""
    tok = build_tiny_tokenizer()
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    act = ScriptedServerManager(tok, [call, "Sunny."])
    reh = ScriptedServerManager(tok, ['<execution_result>{"temp": 4}</execution_result>'])
    cfg = OmegaConf.create(OmegaConf.to_container(per_role_cfg, resolve=True))
    cfg.reward.custom_reward_function.path = None  # no judge here: the reward is verl's business
    loop = EnvaceAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=RoleRoutingClient({"act": act, "rehearse": reh}),
        tokenizer=tok,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
    )
    params = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    outs = asyncio.run(loop.run(params, raw_prompt=TASK, extra_info={"tools": [TOOL], "references": []}))
    assert [o.extra_fields["envace_role"] for o in outs] == ["act", "rehearse", "act"]
    assert len(act.prompt_ids) == 2 and len(reh.prompt_ids) == 1 and not act.texts and not reh.texts
    assert outs[1].prompt_ids == reh.prompt_ids[0] and outs[2].prompt_ids == act.prompt_ids[1]


def test_routing_client_defaults_to_act_and_requires_both_roles():
    tok = build_tiny_tokenizer()
    act, reh = ScriptedServerManager(tok, ["a"]), ScriptedServerManager(tok, [])
    client = RoleRoutingClient({"act": act, "rehearse": reh})
    out = asyncio.run(client.generate("r", prompt_ids=[1, 2], sampling_params={"max_tokens": 8}))
    assert act.prompt_ids == [[1, 2]] and not reh.prompt_ids and out.token_ids[-1] == tok.eos_token_id
    client.tokenizer = tok
    assert act.tokenizer is tok and reh.tokenizer is tok
    with pytest.raises(KeyError):
        client.role_client("simulator")
    with pytest.raises(ValueError, match="missing"):
        RoleRoutingClient({"act": act})


def test_per_role_without_routing_client_is_a_clear_error():
    tok = build_tiny_tokenizer()
    with pytest.raises(TypeError, match="role_client"):
        role_backends(ScriptedServerManager(tok, []), {}, RolloutConfig())
    with pytest.raises(ValueError, match="rehearsal"):
        grpo = RolloutConfig(mode=Mode.EXTERNAL_SIMULATOR)
        role_backends(RoleRoutingClient({"act": 1, "rehearse": 2}), {}, grpo)


# ---------------------------------------------------------------- splitting a batch by role


def test_split_kv_batch_by_role():
    roles = ["act", "rehearse", "act", None, "rehearse", "act"]
    keys = [f"u_0_{i}" for i in range(len(roles))]
    tags = [{"is_padding": r is None, "seq_len": 10 + i} for i, r in enumerate(roles)]
    batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train", extra_info={"temperature": 1.0})
    parts, pad = split_batch_by_role(batch, roles)
    assert parts["act"].keys == ["u_0_0", "u_0_2", "u_0_5"] and parts["rehearse"].keys == ["u_0_1", "u_0_4"]
    assert pad.keys == ["u_0_3"] and pad.tags[0]["is_padding"]
    assert [t["seq_len"] for t in parts["rehearse"].tags] == [11, 14]
    assert parts["act"].partition_id == "train" and parts["act"].extra_info == {"temperature": 1.0}
    only_act, _ = split_batch_by_role(batch.select_keys(["u_0_0"]), ["act"])
    assert set(only_act) == {"act"}  # a role without rows has no sub-batch (no update this step)
    with pytest.raises(ValueError):
        split_batch_by_role(batch, roles[:-1])
    with pytest.raises(ValueError, match="simulator"):
        role_row_indices(["act", "simulator"])


def test_split_dataproto_keeps_role_wise_advantages():
    """Advantages are computed once on the union; each policy's rows carry exactly those values."""
    uids = ["p0"] * 5 + ["p1"] * 3
    roles = ["act", "rehearse", "act", "act", "rehearse", "act", "rehearse", "rehearse"]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.8])
    mask = torch.ones(len(uids), 4)
    scores = torch.zeros(len(uids), 4)
    scores[:, -1] = rewards
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores},
        non_tensors={"uid": role_group_ids(uids, roles), "envace_role": np.array(roles, dtype=object)},
    )
    adv = compute_advantage(data, adv_estimator=ESTIMATOR, config={"norm_adv_by_std_in_grpo": False})
    idx = role_row_indices(list(adv.non_tensor_batch["envace_role"]))
    for role in ("act", "rehearse"):
        part = adv.select_idxs(idx[role])
        assert set(part.non_tensor_batch["envace_role"]) == {role}
        for j, i in enumerate(idx[role]):
            same = [k for k in range(len(uids)) if uids[k] == uids[i] and roles[k] == role]
            baseline = rewards[same].mean()
            expected = float(rewards[i]) if len(same) == 1 else float(rewards[i] - baseline)  # A = R alone
            assert part.batch["advantages"][j, -1].item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- checkpoint paths


def test_checkpoint_paths(tmp_path):
    assert rehearse_checkpoint_dir("/ck/global_step_50") == "/ck/global_step_50/rehearse_actor"
    auto = {"resume_mode": "auto", "default_local_dir": "/ck/per_role_8b"}
    assert resume_step_dir(auto, 50) == "/ck/per_role_8b/global_step_50"
    assert resume_step_dir(auto, 0) is None
    rel = {"resume_mode": "auto", "default_local_dir": "ck"}
    assert resume_step_dir(rel, 7, cwd=str(tmp_path)) == os.path.join(str(tmp_path), "ck", "global_step_7")
    path = {"resume_mode": "resume_path", "resume_from_path": "/x/global_step_3", "default_local_dir": "/ck"}
    assert resume_step_dir(path, 3) == "/x/global_step_3"
    assert resume_step_dir({"resume_mode": "disable", "default_local_dir": "/ck"}, 9) is None
