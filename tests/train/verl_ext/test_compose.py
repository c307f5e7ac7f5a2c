"""Every run's verl config composes with verl's own Hydra config and carries the paper's values."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from verl.utils.config import validate_config

from envace.common.config import load_config
from envace.train.verl_ext.compose import RUN_FILES, compose, run_config_name, run_overrides

CFG = load_config("config/config.yaml")
RUNS = sorted(CFG["training"]["runs"])


@pytest.fixture(scope="module")
def composed():
    return {
        r: compose(run_config_name(CFG, r), run_overrides(CFG, r, "/ck/" + r, "/d/t.parquet")) for r in RUNS
    }


def test_every_run_has_a_file():
    assert set(RUNS) == RUN_FILES


@pytest.mark.parametrize("run", RUNS)
def test_paper_values(composed, run):
    c = composed[run]
    a, ro = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert c.trainer.total_training_steps == 470
    assert a.optim.lr == pytest.approx(1e-6)
    assert c.data.train_batch_size == 16 and ro.n == 4
    assert c.data.max_prompt_length == 12000 and c.data.max_response_length == 8000
    assert ro.prompt_length == 12000 and ro.response_length == 8000  # interpolated from data.*
    assert c.envace.max_turns == 30
    assert a.clip_ratio == pytest.approx(0.2) and a.clip_ratio_c == pytest.approx(3.0)
    assert a.loss_agg_mode == "seq-mean-token-mean" and a.entropy_coeff == 0  # authors' effective loss
    assert c.envace.terminate_on_rehearsal_error is True and c.envace.replay_user_turns is True
    assert c.envace.context_budget == "per_generation" and c.algorithm.envace_singleton_advantage == "reward"
    assert ro.temperature == pytest.approx(1.0)
    assert ro.val_kwargs.temperature == pytest.approx(0.6) and ro.val_kwargs.top_p == pytest.approx(0.95)
    assert ro.val_kwargs.n == 4 and ro.val_kwargs.do_sample
    assert c.trainer.save_freq == 50 and c.trainer.test_freq == 10
    assert a.use_kl_loss is False and a.kl_loss_coef == pytest.approx(1e-4) and c.envace.use_kl_loss is False
    assert c.algorithm.adv_estimator == "envace_role_wise" and c.algorithm.norm_adv_by_std_in_grpo is False
    mode = "envace_per_role_sync" if run == "per_role_8b" else "envace_sync"
    assert ro.agent.default_agent_loop == "envace_rehearsal" and c.trainer.v1.trainer_mode == mode
    assert c.trainer.use_v1 is True  # the list-of-outputs agent-loop path needs the v1 trainer
    assert c.trainer.resume_mode == "auto" and c.trainer.default_local_dir == "/ck/" + run
    assert c.trainer.max_actor_ckpt_to_keep is None  # keep all: Figure 5 evaluates the saved steps
    assert "hf_model" in a.checkpoint.save_contents  # loadable HF weights in actor/huggingface/
    assert a.clip_ratio_low == pytest.approx(0.2) and a.clip_ratio_high == pytest.approx(0.2)
    assert list(c.trainer.logger) == ["console", "file"] and c.trainer.val_before_train is False
    assert c.trainer.experiment_name == run
    if run.startswith("grpo"):  # the caller-only script's simulator sampling
        assert c.envace.simulator.temperature == pytest.approx(0.6) and c.envace.simulator.top_p == 0.8
        assert c.envace.simulator.protocol == "single_call" and c.envace.simulator.attempts == 5
    OmegaConf.to_container(c, resolve=True)  # every interpolation resolves


@pytest.mark.parametrize("run", RUNS)
def test_verl_validate_config(composed, run):
    """verl's own pre-flight check (main_ppo runs it before starting Ray) accepts every run, KL on or off."""
    c = OmegaConf.create(OmegaConf.to_container(composed[run], resolve=True))
    validate_config(c, use_reference_policy=False, use_critic=False)
    c.actor_rollout_ref.actor.use_kl_loss = True
    validate_config(c, use_reference_policy=True, use_critic=False)


def test_run_specific(composed):
    assert composed["envace_8b"].actor_rollout_ref.model.path == "Qwen/Qwen3-8B"
    assert composed["envace_1p7b"].actor_rollout_ref.model.path == "Qwen/Qwen3-1.7B"
    assert composed["envace_8b"].trainer.nnodes == 2 and composed["envace_1p7b"].trainer.nnodes == 1
    for r in ("grpo_8b", "grpo_1p7b"):
        assert composed[r].envace.mode == "external_simulator"
        assert composed[r].envace.simulator.model == CFG["training"]["runs"][r]["simulator"]
    assert composed["envace_8b"].envace.mode == "rehearsal"
    # the authors' padding: copies up to 8 rows per GPU of the run (their micro-batch x world size)
    assert {r: (c.envace.batch_padding, c.envace.padding_multiple) for r, c in composed.items()} == {
        "envace_8b": ("copy", 128), "envace_1p7b": ("copy", 64), "grpo_8b": ("copy", 128),
        "grpo_1p7b": ("copy", 64), "per_role_8b": ("copy", 128)}
    assert composed["per_role_8b"].envace.roles == "per_role"


@pytest.mark.parametrize("run", RUNS)
def test_yaml_files_agree_with_config_yaml(run):
    """The Hydra files alone (no overrides) already hold config.yaml's values: no drift."""
    c = compose(run_config_name(CFG, run), [])
    r = CFG["training"]["runs"][run]
    assert c.actor_rollout_ref.model.path == r["base_model"]
    assert c.trainer.total_training_steps == r["total_steps"]
    assert c.actor_rollout_ref.actor.optim.lr == pytest.approx(r["lr"])
    assert c.data.train_batch_size == r["prompts_per_step"]
    assert c.actor_rollout_ref.rollout.n == r["rollouts_per_prompt"]
    if r.get("roles") == "per_role":  # two policies: the ACT pool (verl's trainer.*) + the REHEARSE pool
        pr = c.envace.per_role
        gpus = c.trainer.nnodes * c.trainer.n_gpus_per_node + pr.rehearse_nnodes * pr.rehearse_n_gpus_per_node
        assert gpus == r["nodes"] * r["gpus_per_node"]
    else:
        assert c.trainer.nnodes == r["nodes"] and c.trainer.n_gpus_per_node == r["gpus_per_node"]
    assert c.envace.use_kl_loss == r["kl"]["use_kl_loss"]
    ep = r["episode"]
    assert c.actor_rollout_ref.actor.loss_agg_mode == r["loss_agg_mode"]
    assert c.envace.terminate_on_rehearsal_error == ep["terminate_on_rehearsal_error"]
    assert c.envace.replay_user_turns == ep["replay_user_turns"]
    assert c.envace.context_budget == ep["context_budget"]
    assert c.algorithm.envace_singleton_advantage == ep["singleton_advantage"]
    assert c.envace.rehearsal_prompt == ep["rehearsal_prompt"]
    assert c.envace.turn_cap == ep["turn_cap"] and c.envace.max_env_steps == ep["max_env_steps"]


def test_kl_switch_reaches_verl():
    cfg = load_config("config/config.yaml")
    cfg["training"]["runs"]["envace_8b"]["kl"]["use_kl_loss"] = True
    c = compose("envace_8b", run_overrides(cfg, "envace_8b"))
    assert c.actor_rollout_ref.actor.use_kl_loss is True


def test_group_filter_switch_reaches_verl():
    """The paper's runs train on every sampled group (the authors' script); ``filter_groups`` turns on
    verl's own DAPO filtering on the run's reward, and verl's trainer accepts the composed config."""
    assert not any(compose(run_config_name(CFG, r), run_overrides(CFG, r)).algorithm.filter_groups.enable
                   for r in ("envace_8b", "per_role_8b"))
    cfg = load_config("config/config.yaml")
    cfg["training"]["runs"]["envace_8b"]["filter_groups"] = {"enable": True, "max_inflight_gen_batches": 2}
    c = compose("envace_8b", run_overrides(cfg, "envace_8b"))
    fg = c.algorithm.filter_groups
    assert fg.enable is True and fg.metric == "reward" and fg.max_inflight_gen_batches == 2
    validate_config(OmegaConf.create(OmegaConf.to_container(c, resolve=True)), use_reference_policy=False,
                    use_critic=False)


def test_unknown_run():
    with pytest.raises(KeyError, match="unknown run"):
        run_overrides(CFG, "nope")


def test_episode_switches_reach_verl():
    """Each episode rule's old value is one config.yaml key away, and reaches the composed config."""
    cfg = load_config("config/config.yaml")
    run = cfg["training"]["runs"]["envace_8b"]
    ov = run_overrides(cfg, "envace_8b")
    for o in ("envace.terminate_on_rehearsal_error=true", "envace.replay_user_turns=true",
              "envace.context_budget=per_generation", "algorithm.envace_singleton_advantage=reward",
              "envace.rehearsal_prompt=rehearsal_v2", "envace.turn_cap=user_turn_end",
              "envace.max_env_steps=200", "algorithm.envace_advantage_sign=1",
              "algorithm.envace_rehearse_advantage=train",
              "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"):
        assert o in ov
    run["episode"] = {"terminate_on_rehearsal_error": False, "replay_user_turns": False,
                      "context_budget": "episode", "singleton_advantage": "zero",
                      "rehearsal_prompt": "rehearsal_v1", "turn_cap": "every_turn", "advantage_sign": -1,
                      "rehearse_advantage": "zero"}
    run["loss_agg_mode"] = "token-mean"
    ov = run_overrides(cfg, "envace_8b")
    for o in ("envace.terminate_on_rehearsal_error=false", "envace.replay_user_turns=false",
              "envace.context_budget=episode", "algorithm.envace_singleton_advantage=zero",
              "envace.rehearsal_prompt=rehearsal_v1", "envace.turn_cap=every_turn",
              "envace.max_env_steps=200", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
              "algorithm.envace_advantage_sign=-1", "algorithm.envace_rehearse_advantage=zero"):
        assert o in ov
    c = compose("envace_8b", ov)
    assert c.envace.terminate_on_rehearsal_error is False and c.envace.replay_user_turns is False
    assert c.envace.context_budget == "episode" and c.algorithm.envace_singleton_advantage == "zero"
    assert c.envace.rehearsal_prompt == "rehearsal_v1" and c.envace.turn_cap == "every_turn"
    assert c.actor_rollout_ref.actor.loss_agg_mode == "token-mean" and c.algorithm.envace_advantage_sign == -1
    assert c.algorithm.envace_rehearse_advantage == "zero"
    assert not any(o.startswith(("data.seed=", "actor_rollout_ref.rollout.seed=")) for o in ov)
    assert compose("envace_8b", ov).actor_rollout_ref.rollout.seed == 42  # no seed: verl's default
    run["seed"] = 7
    c = compose("envace_8b", run_overrides(cfg, "envace_8b"))
    assert c.data.seed == 7 and c.actor_rollout_ref.rollout.seed == 7
    del run["seed"]
    del run["episode"]  # a run without the block gets the authors' rules
    assert "envace.context_budget=per_generation" in run_overrides(cfg, "envace_8b")


def test_episode_rules_enter_the_training_spec_hash():
    """The train rule's spec hash is config_hash(training.runs.<run>) (workflow/rules/common.smk
    run_spec): the episode block lives in the run, so changing a rule changes the hash."""
    from envace.common.config import config_hash

    cfg = load_config("config/config.yaml")
    run = cfg["training"]["runs"]["envace_8b"]
    before = config_hash(run)
    run["episode"]["singleton_advantage"] = "zero"
    assert config_hash(run) != before
