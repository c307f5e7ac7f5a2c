"""The TTS episode function of the evaluation runner: a failure of the episode is a failed sample."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from envace.bench.tts_episode import tts_episode_fn
from envace.common.settings import TTSSetting
from envace.core.rollout import RolloutConfig
from envace.core.settings import tts_config

TTS = {"attempt_max_tokens": 8, "memory_max_tokens": 8, "eval_max_tokens": 8, "aux_max_context_tokens": 64,
       "aux_sampling": {"temperature": 0.6, "top_p": 0.95}, "prompt": "tts_v1"}


def test_tts_episode_turns_episode_errors_into_failed_samples():
    """An exception from the episode during TTS (e.g. the simulated user's opening) fails the sample,
    marked as an exception (not a model's failure)."""

    class BrokenOpening:
        def first_user_message(self) -> str:
            raise RuntimeError("user simulator returned nothing")

    fn = tts_episode_fn(TTS, TTSSetting.parse("parallel_n1_base"), rehearser=None, rehearser_tokenizer=None)
    task = SimpleNamespace(system=None, first_user="", tools=[])
    fields = asyncio.run(fn(task, BrokenOpening(), None, None, RolloutConfig()))
    assert fields["status"] == "failed" and "user simulator returned nothing" in fields["reason"]
    assert fields["extra"]["exception"] == {"type": "RuntimeError", "where": "tts"}


def test_tts_config_of_a_setting():
    rollout = RolloutConfig(max_turns=3)
    config = tts_config(TTS, TTSSetting.parse("sequential_n2_envace"), rollout)
    assert (config.mode, config.n, config.rollout, config.prompt_name) == ("sequential", 2, rollout, "tts_v1")
    assert config.aux_sampling == TTS["aux_sampling"] and config.attempt_max_tokens == 8
    with pytest.raises(ValueError, match="no test-time scaling"):
        tts_config(TTS, TTSSetting.parse("no_tts"), rollout)
