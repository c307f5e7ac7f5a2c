"""The CPU trainer: parameters change with a finite loss, kill + resume, per-role routing, GRPO, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from envace.cli import main
from envace.cpu_trainer import TRACKER, CpuTrainer, TrainerSettings, latest_step
from envace.reward import reference_match_reward
from envace.tiny_model import HFGenerateBackend, tiny_model_and_tokenizer
from envace.tools import ToolCall, render_tool_call

PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
CITIES = ["Paris", "Rome"]


class ScriptedAct:
    """ACT backend: a get_weather call whose city depends on the seed, then a final answer.

    The tiny model is untrained, so the test scripts ACT to get tool calls (and thus REHEARSE rows and
    rewards that differ within a group); REHEARSE is sampled from the real model.
    """

    def __init__(self, tokenizer, seed: int) -> None:
        self.tokenizer = tokenizer
        self.city = CITIES[seed % 2]
        self.turn = 0

    async def generate(self, prompt_ids, params):
        if self.turn == 0:
            text = render_tool_call(ToolCall("get_weather", {"city": self.city}))
        else:
            text = f"It is sunny in {self.city}."
        self.turn += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: params["max_tokens"] - 1]
        ids.append(self.tokenizer.eos_token_id)
        return ids, [-1.0] * len(ids)


def _factory(tokenizer):
    def make(role, model, seed):
        if role == "act":
            return ScriptedAct(tokenizer, seed)
        return HFGenerateBackend(model, [tokenizer.eos_token_id], seed=seed)
    return make


def _reward(messages, example):
    return reference_match_reward(messages, [PARIS])


def _settings(**kw):
    base = dict(total_steps=3, lr=1e-3, prompts_per_step=2, rollouts_per_prompt=4, max_response_tokens=48,
                max_turns=2, save_every=1, rehearse_max_tokens=12, micro_batch_rows=8)
    base.update(kw)
    return TrainerSettings(**base)


def _trainer(converted, tmp_dir, seed=0, simulator=None, **kw):
    model, tok = tiny_model_and_tokenizer(seed)
    examples, _ = converted
    return CpuTrainer(_settings(**kw), examples, tok, model, _reward, tmp_dir, simulator=simulator,
                      log=lambda line: None, backend_factory=_factory(tok))


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def full_run(converted, tmp_path_factory):
    """An uninterrupted 3-step run (shared roles)."""
    ck = tmp_path_factory.mktemp("full")
    trainer = _trainer(converted, ck)
    before = _params(trainer.models["actor"])
    summary = trainer.train()
    return ck, trainer, before, summary


def test_three_steps_change_parameters_with_finite_loss(full_run):
    ck, trainer, before, summary = full_run
    assert summary["final_step"] == 3 and summary["steps_run"] == 3
    lines = _metrics(ck)
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        assert math.isfinite(m["actor/loss"]) and math.isfinite(m["actor/grad_norm"])
        assert m["rows/rehearse"] > 0 and m["rows/act"] > 0  # both roles trained (shared policy)
        assert m["actor/rows"] == m["rows/act"] + m["rows/rehearse"]
    assert any(m["actor/grad_norm"] > 0 for m in lines)
    after = trainer.models["actor"].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_checkpoints_are_pruned_and_tracked(full_run):
    ck, *_ = full_run
    assert latest_step(ck) == 3 and (ck / TRACKER).read_text() == "3"
    assert sorted(p.name for p in ck.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    hf = ck / "global_step_3" / "actor" / "huggingface"
    assert (hf / "config.json").is_file() and (hf / "tokenizer_config.json").is_file()
    assert not list(ck.glob(".tmp_*"))


def test_kill_and_resume_gives_the_same_next_step(full_run, converted, tmp_path):
    ck_full, trainer_full, _, _ = full_run
    first = _trainer(converted, tmp_path)
    first.train(until=2)
    # the "killed" process had logged a step 3 that never reached a checkpoint
    # and was killed while writing the next line (torn JSON)
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 3, "actor/loss": 123.0}) + "\n")
        fh.write('{"step": 4, "actor/lo')
    resumed = _trainer(converted, tmp_path, seed=1)  # different init: the checkpoint must overwrite it
    assert resumed.resumed_from == 2
    summary = resumed.train()
    assert summary["start_step"] == 2 and summary["final_step"] == 3
    a, b = _metrics(ck_full)[2], _metrics(tmp_path)[2]
    assert [m["step"] for m in _metrics(tmp_path)] == [1, 2, 3]
    for key in ("actor/loss", "actor/grad_norm", "reward/mean", "actor/ppo_kl"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    full_state, res_state = trainer_full.models["actor"].state_dict(), resumed.models["actor"].state_dict()
    for k in full_state:
        assert torch.allclose(full_state[k], res_state[k], atol=1e-6), k


def test_per_role_routes_rows_to_their_model(converted, tmp_path):
    trainer = _trainer(converted, tmp_path, roles="per_role", total_steps=1)
    seen = []
    update = trainer._update
    trainer._update = lambda key, rows: seen.append((key, {r.role for r in rows})) or update(key, rows)
    act0, reh0 = _params(trainer.models["actor"]), _params(trainer.models["rehearse"])
    trainer.train()
    assert seen == [("actor", {"act"}), ("rehearse", {"rehearse"})]
    m = _metrics(tmp_path)[0]
    assert m["actor/rows"] == m["rows/act"] and m["rehearse/rows"] == m["rows/rehearse"]
    act1, reh1 = trainer.models["actor"].state_dict(), trainer.models["rehearse"].state_dict()
    assert any(not torch.equal(act0[k], act1[k]) for k in act0)
    assert any(not torch.equal(reh0[k], reh1[k]) for k in reh0)
    assert any(not torch.equal(act1[k], reh1[k]) for k in act1)
    assert (tmp_path / "global_step_1" / "rehearse" / "huggingface" / "config.json").is_file()


def test_grpo_trains_act_only_and_freezes_the_simulator(converted, tmp_path):
    simulator, _ = tiny_model_and_tokenizer(5)
    sim0 = _params(simulator)
    trainer = _trainer(converted, tmp_path, algorithm="grpo", total_steps=1, simulator=simulator)
    trainer.train()
    m = _metrics(tmp_path)[0]
    assert m["rows/rehearse"] == 0 and m["actor/rows"] == m["rows/act"] > 0
    assert all(torch.equal(sim0[k], v) for k, v in simulator.state_dict().items())


def test_train_cli_smoke(repo_root, tmp_path, monkeypatch):
    cfg = yaml.safe_load((repo_root / "config" / "smoke.yaml").read_text())
    cfg["training"]["cpu_trainer"]["warmstart_steps"] = 3
    for run in cfg["training"]["runs"].values():
        run.update(total_steps=2, max_response_tokens=24, max_turns=2, prompts_per_step=2,
                   rollouts_per_prompt=2, save_every=1)
    cfg["evaluation"]["checkpoints"]["steps"] = [1, 2]
    cfg["paths"]["data"] = str(tmp_path / "data")
    cfg["training"]["data"]["source"] = str(repo_root / "tests" / "data" / "cm2_fixture.jsonl")
    config = tmp_path / "smoke.yaml"
    config.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)  # models/smoke/tiny does not exist here: the tiny model is built in-process
    assert main(["data", "--config", str(config), "--out", str(tmp_path / "data" / "cm2_train.parquet"),
                 "--summary", str(tmp_path / "s.json")]) == 0
    argv = ["train", "--config", str(config), "--run", "envace_8b", "--checkpoint-dir", str(tmp_path / "ck"),
            "--done", str(tmp_path / "done.json")]
    assert main(argv) == 0
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["final_step"] == 2 and done["resumed_from"] == 0 and done["trainer"] == "cpu"
    assert done["warmstart_losses"][-1] < done["warmstart_losses"][0]
    for m in _metrics(tmp_path / "ck"):
        # real backends everywhere: the trainer's recomputed log-probs of the rollout's own token ids
        # match the rollout's (no re-tokenisation drift)
        assert m["actor/rows"] > 0 and m["actor/rollout_logprob_gap_max"] < 1e-4
    assert main(argv) == 0  # re-submitted: resumes at the last checkpoint, nothing left to do
    again = json.loads((tmp_path / "done.json").read_text())
    assert again["resumed_from"] == 2 and again["steps_run"] == 0


def test_rows_get_role_wise_advantages(converted, tmp_path):
    """Rows of one prompt slot: per-role baselines weighted by rows, dropped samples excluded."""
    from envace.rollout import Generation, Termination, Trajectory

    trainer = _trainer(converted, tmp_path, total_steps=1)
    ex = converted[0][0]

    def traj(*gens):
        return Trajectory([], list(gens), Termination.FINAL_ANSWER, [], [], 1)

    act = Generation("act", [1, 2, 3], 2, [3], [-0.1], 0)
    reh = Generation("rehearse", [5, 6, 7], 2, [7], [-0.2], 0)
    rollouts = [(0, ex, traj(act, reh)), (0, ex, traj(act, act)), (0, ex, traj(act, reh)), (1, ex, traj(act))]
    rows = trainer._rows(rollouts, [1.0, 0.0, None, 0.5])
    got = [(r.role, r.reward, round(r.advantage, 6)) for r in rows]
    # slot 0, act rows: rewards 1, 0, 0 -> baseline 1/3; the single rehearse row is its own baseline;
    # the dropped rollout (None) contributes nothing; slot 1 is its own group
    assert got == [("act", 1.0, round(2 / 3, 6)), ("rehearse", 1.0, 0.0), ("act", 0.0, round(-1 / 3, 6)),
                   ("act", 0.0, round(-1 / 3, 6)), ("act", 0.5, 0.0)]
    assert rows[0].ids == [1, 2, 3] and rows[0].prompt_len == 2


def test_kl_and_entropy_terms(converted, tmp_path):
    """KL against the frozen initial policy is 0 at step 1 and positive once the policy moved."""
    trainer = _trainer(converted, tmp_path, total_steps=2, use_kl_loss=True, kl_coef=0.1, entropy_coef=0.01)
    trainer.train()
    first, second = _metrics(tmp_path)
    assert abs(first["actor/kl_loss"]) < 1e-6
    assert second["actor/kl_loss"] > 0
    assert first["actor/entropy"] > 0 and math.isfinite(second["actor/loss"])
