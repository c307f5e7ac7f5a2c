"""One default per setting: the rollout settings of training and of evaluation, built from a config that
omits every optional key, carry the schema's documented defaults; TTS setting ids read and write one way."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from omegaconf import OmegaConf

from envace.common.config import ConfigError, complete_config, episode_rules, load_config
from envace.common.settings import EPISODE_DEFAULTS, NO_TTS, SCHEMA, TTSSetting, tts_settings
from envace.core.rollout import RolloutConfig
from envace.core.settings import evaluation_rollout
from envace.train.verl_ext.agent_loop import rollout_config_from
from envace.train.verl_ext.compose import CONFIG_DIR, compose, run_config_name, run_overrides

PAPER = load_config("config/config.yaml")

#: episode rule -> the RolloutConfig field it sets (rehearse_max_tokens: the REHEARSE reply cap)
FIELD = {"terminate_on_rehearsal_error": "terminate_on_rehearsal_error",
         "terminate_on_rehearsal_malformed": "terminate_on_rehearsal_malformed",
         "replay_user_turns": "replay_user_turns", "context_budget": "context_budget",
         "rehearsal_prompt": "prompt_name", "turn_cap": "turn_cap", "max_env_steps": "max_env_steps",
         "rehearse_truncation": "rehearse_truncation", "rehearse_think_switch": "rehearse_think_switch"}


def rules_of(config: RolloutConfig) -> dict[str, object]:
    """The episode rules a RolloutConfig applies, keyed as in ``training.runs.<run>.episode``."""
    out = {rule: getattr(config, name) for rule, name in FIELD.items()}
    out["rehearse_max_tokens"] = config.rehearse_sampling["max_tokens"]
    out["enable_thinking"] = config.template_kwargs.get("enable_thinking", True)
    return out


ROLLOUT_RULES = set(FIELD) | {"rehearse_max_tokens", "enable_thinking"}
UPDATE_RULES = {"singleton_advantage", "advantage_sign", "rehearse_advantage"}  # the estimator reads these


def test_every_episode_rule_has_one_documented_default():
    props = yaml.safe_load(SCHEMA.read_text())["$defs"]["training_run"]["properties"]["episode"]["properties"]
    assert set(EPISODE_DEFAULTS) == set(props) == ROLLOUT_RULES | UPDATE_RULES
    assert EPISODE_DEFAULTS == {k: p["x-default"] for k, p in props.items()}
    assert episode_rules({}) == EPISODE_DEFAULTS


def test_rollout_config_defaults_are_the_training_defaults():
    assert rules_of(RolloutConfig()) == {k: EPISODE_DEFAULTS[k] for k in ROLLOUT_RULES}


def test_verl_files_start_from_the_same_defaults():
    """The values in ``_envace_common.yaml`` (overridden by compose, but what a bare verl compose holds)."""
    common = OmegaConf.load(Path(CONFIG_DIR) / "_envace_common.yaml")
    envace = common.envace
    assert bool(common.data.apply_chat_template_kwargs.enable_thinking) == EPISODE_DEFAULTS["enable_thinking"]
    assert common.algorithm.envace_singleton_advantage == EPISODE_DEFAULTS["singleton_advantage"]
    assert common.algorithm.envace_advantage_sign == EPISODE_DEFAULTS["advantage_sign"]
    assert common.algorithm.envace_rehearse_advantage == EPISODE_DEFAULTS["rehearse_advantage"]
    for rule in ROLLOUT_RULES - {"enable_thinking"}:
        assert envace[rule] == EPISODE_DEFAULTS[rule], rule


@pytest.mark.parametrize("run", ["envace_8b", "grpo_8b"])
def test_training_rollout_from_a_run_without_episode_rules(run):
    """A run with no ``episode`` block, composed as ``envace train`` composes it: its rollout gets the
    defaults, and so does a rollout built from an ``envace`` section that names none of them."""
    cfg = copy.deepcopy(PAPER)
    cfg["training"]["runs"][run].pop("episode", None)
    cfg = complete_config(cfg)
    composed = compose(run_config_name(cfg, run), run_overrides(cfg, run, "/ck/" + run, "/d/t.parquet"))
    envace = OmegaConf.to_container(composed.envace, resolve=True)
    chat = OmegaConf.to_container(composed.data.apply_chat_template_kwargs, resolve=True)
    built = rollout_config_from(envace, composed.actor_rollout_ref.rollout, {}, chat)
    assert rules_of(built) == {k: EPISODE_DEFAULTS[k] for k in ROLLOUT_RULES}
    assert composed.algorithm.envace_singleton_advantage == EPISODE_DEFAULTS["singleton_advantage"]
    assert composed.algorithm.envace_advantage_sign == EPISODE_DEFAULTS["advantage_sign"]
    assert composed.algorithm.envace_rehearse_advantage == EPISODE_DEFAULTS["rehearse_advantage"]
    bare = rollout_config_from({}, SimpleNamespace(prompt_length=100, response_length=50), {})
    assert rules_of(bare) == {k: EPISODE_DEFAULTS[k] for k in ROLLOUT_RULES}


@pytest.mark.parametrize("path", ["config/config.yaml", "config/smoke.yaml"])
def test_evaluation_rollout_states_the_evaluation_rules(path):
    cfg = load_config(path)
    built = evaluation_rollout(cfg)
    episode, sampling = cfg["evaluation"]["episode"], cfg["evaluation"]["sampling"]
    assert built.context_budget == episode["context_budget"] and built.turn_cap == episode["turn_cap"]
    assert built.on_act_parse_error == episode["on_act_parse_error"]
    assert built.template_kwargs.get("enable_thinking", True) == episode["enable_thinking"]
    assert built.max_turns == sampling["max_turns"] and built.max_response_tokens == sampling["max_tokens"]
    assert built.act_sampling == {k: sampling[k] for k in ("temperature", "top_p", "max_tokens")}
    assert built.prompt_name == cfg["tts"]["rehearse"]["prompt"]


def test_evaluation_episode_rules_have_no_second_default():
    cfg = copy.deepcopy(PAPER)
    del cfg["evaluation"]["episode"]["turn_cap"]
    with pytest.raises(ConfigError, match="evaluation.episode"):
        complete_config(cfg)


def test_tts_setting_ids_round_trip():
    ids = PAPER["tts"]["settings"]
    assert ids[0] == NO_TTS and len(ids) == len(set(ids)) == 1 + 2 * 3 * 2
    assert [str(TTSSetting.parse(s)) for s in ids] == ids == [str(s) for s in tts_settings(PAPER["tts"])]
    assert TTSSetting.parse("sequential_n3_base") == TTSSetting("sequential", 3, "base")
    assert not TTSSetting.parse(NO_TTS).is_tts and TTSSetting.parse("parallel_n1_envace").is_tts
    for bad in ("parallel_3_base", "parallel_n0_base", "beam_n2_base", "parallel_n2_my_base", "parallel_n2_",
                "other-parallel_n2_base", "released-", "released-beam_n2_base"):
        with pytest.raises(ValueError, match="not a TTS setting id"):
            TTSSetting.parse(bad)
    # the released-weights suite: the same ids with a prefix
    released = PAPER["tts"]["released_settings"]
    assert released == [f"released-{s}" for s in ids]
    assert [str(TTSSetting.parse(s)) for s in released] == released
    assert TTSSetting.parse("released-parallel_n2_envace") == TTSSetting("parallel", 2, "envace", "released")
    assert TTSSetting.parse("released-no_tts") == TTSSetting(suite="released")


def test_a_rehearser_name_that_would_break_the_ids_is_a_config_error():
    cfg = copy.deepcopy(PAPER)
    cfg["tts"]["rehearsers"]["my_base"] = cfg["tts"]["rehearsers"].pop("base")
    with pytest.raises(ConfigError, match="tts.rehearsers"):
        complete_config(cfg)



def test_training_loggers_reach_verl_and_change_no_hash():
    """``training.loggers`` (default console + file) becomes verl's ``trainer.logger``; a tracker added
    changes no run's or evaluation's hash; a list without ``file`` (metrics.jsonl) is refused."""
    from envace.common.config import eval_hash, training_key

    default = run_overrides(PAPER, "envace_8b", "/ck", "/d.parquet")
    assert "trainer.logger=[console,file]" in default
    cfg = copy.deepcopy(PAPER)
    cfg["training"]["loggers"] = ["console", "file", "wandb"]
    cfg = complete_config(cfg)
    overrides = run_overrides(cfg, "envace_8b", "/ck", "/d.parquet")
    composed = compose(run_config_name(cfg, "envace_8b"), overrides)
    assert list(composed.trainer.logger) == ["console", "file", "wandb"]
    assert training_key(cfg, "envace_8b") == training_key(PAPER, "envace_8b")
    assert eval_hash(cfg, "envace_8b", "tau2") == eval_hash(PAPER, "envace_8b", "tau2")
    cfg["training"]["loggers"] = ["console", "wandb"]
    with pytest.raises(ConfigError, match="training.loggers"):
        complete_config(cfg)


def test_step_timeout_defaults_to_the_schema_and_is_in_no_hash():
    """``training.step_timeout_min``: unset = the schema's x-default (0, unwatched); the configs' values in
    seconds; changing it changes no run's or evaluation's hash."""
    from envace.common.config import eval_hash, training_key
    from envace.common.settings import step_timeout_s

    assert step_timeout_s({}) == 0
    assert step_timeout_s(PAPER["training"]) == 180 * 60
    cfg = copy.deepcopy(PAPER)
    cfg["training"]["step_timeout_min"] = 5
    assert step_timeout_s(cfg["training"]) == 300
    assert training_key(cfg, "envace_8b") == training_key(PAPER, "envace_8b")
    assert eval_hash(cfg, "envace_8b", "tau2") == eval_hash(PAPER, "envace_8b", "tau2")
