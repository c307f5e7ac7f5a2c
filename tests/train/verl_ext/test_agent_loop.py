"""The agent loop's outputs through verl's AgentLoopOutput, with a stand-in server manager (tiny model)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.rollout.replica import TokenOutput

from envace.core.rollout import RolloutConfig, run_rollout
from envace.serve.tiny_model import HFGenerateBackend, tiny_model_and_tokenizer
from envace.train.verl_ext.advantage import ESTIMATOR, role_group_ids
from envace.train.verl_ext.agent_loop import ServerManagerBackend, trajectory_outputs
from tests.fixtures import ScriptedServerManager

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Find the weather in Paris."}]


class StandInServerManager:
    """verl's server-manager interface backed by the tiny HF model."""

    def __init__(self, model, eos, seed=0):
        self.backend = HFGenerateBackend(model, [eos], seed=seed)
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        self.calls.append((request_id, sampling_params))
        ids, lps = await self.backend.generate(prompt_ids, sampling_params)
        return TokenOutput(token_ids=ids, log_probs=lps)


def _rollout(seed: int):
    model, tok = tiny_model_and_tokenizer(0)
    sm = StandInServerManager(model, tok.eos_token_id, seed)
    backend = ServerManagerBackend(sm, {"logprobs": True})
    cfg = RolloutConfig(
        max_turns=3,
        max_response_tokens=96,
        act_sampling={"temperature": 1.0, "max_tokens": 32},
        rehearse_sampling={"temperature": 1.0, "max_tokens": 16},
    )
    traj = asyncio.run(run_rollout(backend, tok, MESSAGES, TOOLS, cfg))
    return traj, sm


def test_outputs_are_the_generations():
    traj, sm = _rollout(0)
    outs = trajectory_outputs(traj, 0.5)
    gens = [g for g in traj.generations if g.trainable]
    assert len(outs) == len(gens) == len(sm.calls)
    assert len({rid for rid, _ in sm.calls}) == 1  # one sticky request id per trajectory
    for o, g in zip(outs, gens, strict=True):
        d = o.as_dict()
        assert d["prompts"].tolist() == g.prompt_ids and d["responses"].tolist() == g.response_ids
        assert d["response_mask"].sum().item() == len(g.response_ids)
        assert torch.allclose(d["rollout_log_probs"], torch.tensor(g.logprobs, dtype=torch.float32))
        assert o.extra_fields["envace_role"] == g.role
    assert outs[-1].reward_score == 0.5 and "envace_messages" in outs[-1].extra_fields
    assert all(o.reward_score is None for o in outs[:-1])


def test_role_wise_advantage_through_verl_compute_advantage():
    rows, uids, roles, rewards = [], [], [], []
    for k, (uid, reward) in enumerate([("p0", 1.0), ("p0", 0.0), ("p1", 0.3)]):
        traj, _ = _rollout(k)
        for o in trajectory_outputs(traj, reward):
            rows.append(o)
            uids.append(uid)
            roles.append(o.extra_fields["envace_role"])
            rewards.append(reward)
    t = max(len(o.response_ids) for o in rows)
    mask = torch.zeros(len(rows), t)
    scores = torch.zeros(len(rows), t)
    for i, o in enumerate(rows):
        n = len(o.response_ids)
        mask[i, :n] = 1
        if n:
            scores[i, n - 1] = rewards[i]
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores},
        non_tensors={"uid": role_group_ids(uids, roles)},
    )
    out = compute_advantage(data, adv_estimator=ESTIMATOR, config={"norm_adv_by_std_in_grpo": False})
    adv = out.batch["advantages"]
    for i in range(len(rows)):
        same = [j for j in range(len(rows)) if uids[j] == uids[i] and roles[j] == roles[i]]
        # a one-row group: A = R (verl's GRPO: mean 0, std 1; the default singleton rule)
        expected = rewards[i] if len(same) == 1 else rewards[i] - np.mean([rewards[j] for j in same])
        assert torch.allclose(adv[i], torch.full_like(adv[i], expected) * mask[i], atol=1e-6)


def test_fields_verl_v1_worker_needs():
    """reward_extra_info on the last output (verl copies it to the earlier rows) and the weight versions
    the server reported (TokenOutput.extra_fields) on every output (verl's _compute_metrics)."""

    class Versioned(StandInServerManager):
        step = 3

        async def generate(self, request_id, **kw):
            out = await super().generate(request_id, **kw)
            out.extra_fields = {"global_steps": self.step}
            Versioned.step += 1
            return out

    model, tok = tiny_model_and_tokenizer(0)
    backend = ServerManagerBackend(Versioned(model, tok.eos_token_id, 0), {"logprobs": True})
    cfg = RolloutConfig(max_turns=2, act_sampling={"max_tokens": 16}, rehearse_sampling={"max_tokens": 8})
    traj = asyncio.run(run_rollout(backend, tok, MESSAGES, TOOLS, cfg))
    steps = (backend.min_global_steps, backend.max_global_steps)
    assert steps == (3, 3 + len(traj.generations) - 1)
    outs = trajectory_outputs(traj, 1.0, reward_info={"judge_failures": 0}, global_steps=steps)
    assert outs[-1].extra_fields["reward_extra_info"] == {"score": 1.0, "judge_failures": 0}
    for o in outs:
        assert (o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"]) == steps


def test_trajectory_without_generation_is_a_masked_row():
    """No generation (prompt over the limit): one row verl can store (as_dict puts the reward on the
    last response token: an empty response raised IndexError) that no baseline sees."""
    from envace.core.rollout import Termination, Trajectory

    traj = Trajectory(messages=[], generations=[], termination=next(iter(Termination)), act_ids=[1, 2, 3],
                      act_segments=[], num_turns=0)
    (out,) = trajectory_outputs(traj, None, pad_token_id=0)
    d = out.as_dict()  # verl's own conversion
    assert d["responses"].tolist() == [0] and d["response_mask"].tolist() == [0]
    assert d["rm_scores"].tolist() == [0.0]
    assert out.extra_fields["reward_extra_info"] == {"score": 0.0}


def test_rollout_settings_reach_the_loop_from_verl_config():
    """envace.terminate_on_* and verl's data.apply_chat_template_kwargs reach the rollout config."""
    from types import SimpleNamespace

    from envace.train.verl_ext.agent_loop import rollout_config_from

    rollout = SimpleNamespace(prompt_length=100, response_length=50)
    section = {"terminate_on_rehearsal_malformed": False, "terminate_on_rehearsal_error": True}
    cfg = rollout_config_from(section, rollout, {"temperature": 0.5},
                              chat_template_kwargs={"enable_thinking": False})
    assert cfg.terminate_on_rehearsal_malformed is False and cfg.terminate_on_rehearsal_error is True
    assert cfg.template_kwargs == {"enable_thinking": False}
    assert cfg.act_sampling == {"temperature": 0.5, "max_tokens": 50}


def test_the_external_simulator_samples_with_its_own_settings():
    """training.runs.<run>.simulator_sampling (envace.simulator.temperature / .top_p) sets the GRPO
    baseline's simulator replies only; ACT keeps verl's sampling, and a REHEARSE policy ignores it."""
    from types import SimpleNamespace

    from envace.train.verl_ext.agent_loop import rollout_config_from

    rollout = SimpleNamespace(prompt_length=100, response_length=50)
    section = {"mode": "external_simulator", "rehearse_max_tokens": 40,
               "simulator": {"model": "m", "temperature": 0.6, "top_p": 0.8}}
    cfg = rollout_config_from(section, rollout, {"temperature": 1.0, "top_p": 1.0})
    assert cfg.rehearse_sampling == {"temperature": 0.6, "top_p": 0.8, "max_tokens": 40}
    assert cfg.act_sampling == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 50}
    unset = rollout_config_from({**section, "simulator": {"model": "m"}}, rollout, {"temperature": 1.0})
    assert unset.rehearse_sampling == {"temperature": 1.0, "max_tokens": 40}
    shared = rollout_config_from({**section, "mode": "rehearsal"}, rollout, {"temperature": 1.0})
    assert shared.rehearse_sampling == {"temperature": 1.0, "max_tokens": 40}
    assert (cfg.simulator_protocol, cfg.simulator_attempts) == ("rehearsal", 5)  # absent: ours before
    single = rollout_config_from({**section, "simulator": {"model": "m", "protocol": "single_call",
                                                           "attempts": 3}}, rollout, {"temperature": 1.0})
    assert (single.simulator_protocol, single.simulator_attempts) == ("single_call", 3)


def test_parameters_key_rule_reaches_the_rollout_parser(monkeypatch):
    """training.reward_rules.parameters_key travels as ENVACE_REWARD_RULES (envace train sets it for
    the Ray workers) to the rollout's parser: a call keyed "parameters" parses, or is a parse error."""
    from types import SimpleNamespace

    from envace.core.tools import parse_tool_calls
    from envace.train.verl_ext.agent_loop import rollout_config_from

    rollout = SimpleNamespace(prompt_length=100, response_length=50)
    text = '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Oslo"}}\n</tool_call>'
    monkeypatch.delenv("ENVACE_REWARD_RULES", raising=False)
    on = rollout_config_from({}, rollout, {})
    assert on.parameters_key is True and parse_tool_calls(text, parameters_key=True).error is None
    monkeypatch.setenv("ENVACE_REWARD_RULES", '{"parameters_key": false}')
    off = rollout_config_from({}, rollout, {})
    assert off.parameters_key is False and parse_tool_calls(text, parameters_key=False).error is not None


def test_episode_rule_defaults_and_switches_from_verl_config():
    """The authors' rules by default (no key in the envace section); the old values one key away."""
    from types import SimpleNamespace

    from envace.train.verl_ext.agent_loop import rollout_config_from

    rollout = SimpleNamespace(prompt_length=100, response_length=50)
    cfg = rollout_config_from({}, rollout, {})
    assert cfg.terminate_on_rehearsal_error is True and cfg.replay_user_turns is True
    assert cfg.context_budget == "per_generation" and cfg.prompt_name == "rehearsal_v2"
    assert cfg.turn_cap == "user_turn_end" and cfg.max_env_steps == 200
    assert (cfg.max_prompt_tokens, cfg.max_response_tokens, cfg.act_sampling["max_tokens"]) == (100, 50, 50)
    old = rollout_config_from({"terminate_on_rehearsal_error": False, "replay_user_turns": False,
                               "context_budget": "episode", "rehearsal_prompt": "rehearsal_v1",
                               "turn_cap": "every_turn"}, rollout, {})
    assert old.terminate_on_rehearsal_error is False and old.replay_user_turns is False
    assert old.context_budget == "episode" and old.prompt_name == "rehearsal_v1"
    assert old.turn_cap == "every_turn"


def _scripted_loop(texts, section=None):
    from types import SimpleNamespace

    from envace.serve.tiny_model import build_tiny_tokenizer
    from envace.train.verl_ext.agent_loop import EnvaceAgentLoop

    tok = build_tiny_tokenizer()
    loop = object.__new__(EnvaceAgentLoop)  # AgentLoopBase.__init__ needs a running verl worker
    loop.envace_cfg = dict(section or {})
    loop.rollout_config = SimpleNamespace(prompt_length=4096, response_length=256)
    loop.tokenizer = tok
    loop.server_manager = ScriptedServerManager(tok, texts)
    seen = {}

    def reward(data_source, solution_str, ground_truth, extra_info):
        seen.update(extra_info)
        return 1.0

    loop._reward_fn = reward
    return loop, seen


def test_agent_loop_replays_the_rows_user_turns():
    """A two-user-turn row (extra_info["user_turns"], a JSON string as the parquet holds it): the second
    user turn is replayed after the first final answer; the reward sees the termination reason."""
    import json

    search = '<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'
    texts = [search, '<execution_result>{"t": 18}</execution_result>', "18 degrees.", "Bye."]
    loop, seen = _scripted_loop(texts)
    extra = {"tools": json.dumps(TOOLS), "user_turns": json.dumps(["And tomorrow?"])}
    outs = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=MESSAGES, extra_info=extra))
    assert [(o.extra_fields["envace_role"], o.extra_fields["envace_user_turn"]) for o in outs] == [
        ("act", 0), ("rehearse", 0), ("act", 0), ("act", 1)]
    assert "And tomorrow?" in loop.tokenizer.decode(outs[-1].prompt_ids)
    assert outs[-1].reward_score == 1.0
    assert seen["termination"] == "final_answer" and seen["user_turns_played"] == 2 and seen["num_turns"] == 3
    assert [m["content"] for m in seen["messages"] if m["role"] == "user"] == [MESSAGES[0]["content"],
                                                                              "And tomorrow?"]
    # the old value, and rows without the key: one user turn
    for section, row in (({"replay_user_turns": False}, extra), ({}, {"tools": json.dumps(TOOLS)})):
        loop, seen = _scripted_loop(texts[:3], section)
        outs = asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info=row))
        assert len(outs) == 3 and seen["user_turns_played"] == 1 and seen["termination"] == "final_answer"


def test_agent_loop_rehearsal_error_ends_by_default():
    import json

    search = '<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'
    error = '<execution_result>{"error": "INVALID_PARAMETERS", "message": "m"}</execution_result>'
    loop, seen = _scripted_loop([search, error])
    asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info={"tools": json.dumps(TOOLS)}))
    assert seen["termination"] == "rehearsal_error"
    loop, seen = _scripted_loop([search, error, "Sorry."], {"terminate_on_rehearsal_error": False})
    asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info={"tools": json.dumps(TOOLS)}))
    assert seen["termination"] == "final_answer"


class _KeyJudgeCompletions:
    """Judge stand-in: an item whose question is ``KEY=<word>`` passes at a step that contains the word."""

    def __init__(self):
        self.asked = []

    def create(self, **kw):
        from types import SimpleNamespace

        user = kw["messages"][1]["content"]
        step = user.split("(the step to judge)")[1].split("# Checklist item")[0]
        word = user.split("Question: KEY=")[1].split("\n")[0]
        self.asked.append((step, word))
        content = '{"passed": %s, "reason": "r"}' % ("true" if word in step else "false")
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])


def test_agent_loop_judge_stops_the_dialogue(monkeypatch):
    """reward checklist: turn 0's required item (KEY=20) fails, so user turn 1 is never replayed; the
    episode reward reuses the in-episode verdicts: (0.5 + 0) / 2 = 0.25. The switch false: turn 1 is
    played, (0.5 + 1) / 2 = 0.75. reference_match (smoke): no judge, never stopped."""
    import json
    from types import SimpleNamespace

    import envace.train.reward_fn as rw
    from envace.train.judge import ChecklistJudge, JudgeConfig

    search = '<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'
    texts = [search, '<execution_result>{"t": 18}</execution_result>', "18 degrees.", "Bye."]
    checklists = [[{"question": "KEY=search", "focus_on": "assistant.content", "weight": 0.5},
                   {"question": "KEY=20", "focus_on": "assistant.content", "weight": 0.5,
                    "required_for_next_turn": True}],
                  [{"question": "KEY=Bye", "focus_on": "assistant.content", "weight": 1.0}]]
    extra = {"tools": json.dumps(TOOLS), "user_turns": json.dumps(["Thanks!"])}
    reward_model = {"ground_truth": json.dumps(checklists)}
    monkeypatch.setenv("ENVACE_REWARD", "checklist")
    cases = (({}, 3, "dialogue_stopped", 0.25, 4),
             ({"stop_on_required_failed": False}, 4, "final_answer", 0.75, 5))
    for rules, n_rows, termination, reward, asked in cases:
        monkeypatch.setenv("ENVACE_REWARD_RULES", json.dumps(rules))
        completions = _KeyJudgeCompletions()
        client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
        judge = ChecklistJudge(JudgeConfig(base_url="u", model="m", max_concurrency=1), client=client)
        monkeypatch.setattr(rw, "_PROCESS_JUDGE", judge)
        loop, _ = _scripted_loop(texts)
        loop._reward_fn = rw.compute_score
        outs = asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info=extra, reward_model=reward_model))
        assert len(outs) == n_rows and outs[-1].extra_fields["envace_termination"] == termination
        assert outs[-1].reward_score == pytest.approx(reward)
        assert len(completions.asked) == len(set(completions.asked)) == asked  # each (step, item) once
    monkeypatch.setenv("ENVACE_REWARD", "reference_match")
    loop, _ = _scripted_loop(texts)
    loop._reward_fn = rw.compute_score
    assert loop._dialogue_gate({}, extra) is None
    outs = asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info=extra, reward_model=reward_model))
    assert len(outs) == 4 and outs[-1].extra_fields["envace_termination"] == "final_answer"


def test_blank_rows_get_their_own_penalty_through_trainer(monkeypatch):
    """Authors' apply_invalid_action_penalty: -0.1 on each blank row. verl copies the trajectory's reward
    to every row; the agent loop marks each row's penalty and EnvaceTrainer adds it to that row's
    last-token reward in TransferQueue (here a dict standing in for TransferQueue's store)."""
    import torch
    import transfer_queue as tq

    from envace.train.verl_ext.trainer import EnvaceTrainer, penalised_scores, row_penalty_of

    traj, _ = _rollout(0)
    gens = [g for g in traj.generations if g.trainable]
    first = gens[0].response_ids
    outs = trajectory_outputs(traj, 0.5, row_penalty=lambda ids: -0.1 if ids == first else 0.0)
    assert [o.extra_fields["envace_row_penalty"] for o in outs][:1] == [-0.1]
    assert all(o.extra_fields["envace_row_penalty"] == 0.0 for o in outs if o.response_ids != first)
    assert [o.extra_fields["envace_row_penalty"] for o in trajectory_outputs(traj, 0.5)] == [0.0] * len(outs)

    rows = [torch.tensor([0.0, 0.0, 0.5]), torch.tensor([0.5]), torch.tensor([0.0, 0.5])]
    got = penalised_scores(rows, [-0.1, 0.0, -0.1])
    assert [r.tolist() for r in got] == [[0.0, 0.0, pytest.approx(0.4)], [0.5], [0.0, pytest.approx(0.4)]]
    assert rows[0][-1].item() == 0.5  # the inputs are not changed in place
    wrapped = type("Wrapped", (), {"data": {"envace_row_penalty": type("V", (), {"data": -0.1})()}})()
    assert row_penalty_of(wrapped) == -0.1
    assert row_penalty_of({"other": 1}) == 0.0 and row_penalty_of(None) == 0.0

    store = {"rm_scores": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}
    monkeypatch.setattr(tq, "kv_batch_get", lambda keys, partition_id, select_fields: {
        f: store[f] for f in select_fields})
    monkeypatch.setattr(tq, "kv_batch_put",
                        lambda keys, partition_id, fields: store.update(dict(fields.items())))
    batch = type("Meta", (), {"keys": ["a", "b", "c"], "partition_id": "train"})()
    metrics: dict = {}
    extra = [{"envace_row_penalty": -0.1}, {"envace_row_penalty": 0.0}, {}]
    EnvaceTrainer._apply_row_penalties(object.__new__(EnvaceTrainer), batch, extra, metrics)
    assert metrics["envace/rows/penalised"] == 1
    after = [r.tolist() for r in store["rm_scores"].unbind()]
    assert after == [[0.0, 0.0, pytest.approx(0.4)], [0.5], [0.0, 0.5]]


def test_rehearse_reference_counts_reach_the_trainer_metrics():
    """The same call twice against two references (18, then 19), both rehearsed as 18: the rows carry the
    trajectory's counts, and the trainer's step metrics read them once per trajectory (first rows)."""
    import json

    from envace.train.verl_ext.trainer import rehearse_reference_stats

    search = '<tool_call>\n{"name": "search", "arguments": {"query": "paris"}}\n</tool_call>'
    said = '<execution_result>{"t": 18}</execution_result>'
    loop, _ = _scripted_loop([search, said, search, said, "18 degrees."])
    call = {"name": "search", "arguments": {"query": "paris"}}
    extra = {"tools": json.dumps(TOOLS),
             "references": [{"call": call, "response": {"t": 18}}, {"call": call, "response": {"t": 19}}]}
    outs = asyncio.run(loop.run({}, raw_prompt=MESSAGES, extra_info=extra))
    counts = {k: outs[0].extra_fields[f"envace_rehearse_{k}"]
              for k in ("answered", "malformed", "referenced", "exact", "agree")}
    assert counts == {"answered": 2, "malformed": 0, "referenced": 2, "exact": 1, "agree": 2}
    assert all(o.extra_fields["envace_rehearse_exact"] == 1 for o in outs)
    fields = [o.extra_fields for o in outs] * 2  # two trajectories alike
    assert rehearse_reference_stats(fields, None) == {
        "envace/rehearse/answered": 4.0, "envace/rehearse/malformed_share": 0.0,
        "envace/rehearse/referenced_share": 1.0, "envace/rehearse/reference_exact": 0.5,
        "envace/rehearse/reference_agree": 1.0}
    assert rehearse_reference_stats([{"envace_row": 0}], None) == {"envace/rehearse/answered": 0.0}
