"""The rollout and test-time-scaling settings of an evaluation, built in one place from the validated config.

:func:`evaluation_rollout` turns ``evaluation.sampling``, ``evaluation.episode`` and ``tts.rehearse`` into
the :class:`~envace.core.rollout.RolloutConfig` every evaluation and test-time-scaling run uses (REAL
mode; the REHEARSE settings act only inside TTS attempts). Training builds its own from verl's config
(:func:`envace.train.verl_ext.agent_loop.rollout_config_from`); the episode rules a training run omits
default to :data:`envace.common.settings.EPISODE_DEFAULTS`, which are also ``RolloutConfig``'s defaults.
:func:`tts_config` turns the ``tts`` block and one :class:`~envace.common.settings.TTSSetting` into the
:class:`~envace.core.tts.TTSConfig` of that setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envace.common.settings import TTSSetting
from envace.core.rollout import Mode, RolloutConfig, template_kwargs
from envace.core.tts import TTSConfig

#: The sampling keys an evaluation passes to its model server (the rest of ``evaluation.sampling`` are
#: limits: ``max_turns``, ``max_prompt_tokens``).
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")


def _sampling(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k in SAMPLING_KEYS}


def evaluation_rollout(cfg: Mapping[str, Any]) -> RolloutConfig:
    """The rollout settings of every evaluation episode of ``cfg`` (a validated config: every key read
    here is required by the schema, so none has a second default in code)."""
    sampling, episode = cfg["evaluation"]["sampling"], cfg["evaluation"]["episode"]
    rehearse = cfg["tts"]["rehearse"]
    return RolloutConfig(
        mode=Mode.REAL,
        max_turns=int(sampling["max_turns"]),
        max_prompt_tokens=int(sampling["max_prompt_tokens"]),
        max_response_tokens=int(sampling["max_tokens"]),
        act_sampling=_sampling(sampling),
        context_budget=episode["context_budget"],
        turn_cap=episode["turn_cap"],
        on_act_parse_error=episode["on_act_parse_error"],
        template_kwargs=template_kwargs(bool(episode["enable_thinking"])),
        rehearse_sampling=_sampling(rehearse),
        prompt_name=rehearse["prompt"],
        max_rehearse_context_tokens=int(rehearse["max_context_tokens"]),
        rehearse_truncation="none",  # a test-time rehearsal is bounded by its own max_context_tokens
    )


def tts_config(tts: Mapping[str, Any], setting: TTSSetting, rollout: RolloutConfig) -> TTSConfig:
    """The :class:`~envace.core.tts.TTSConfig` of one TTS setting from the ``tts`` config block, around the
    evaluation's ``rollout`` settings."""
    if not setting.is_tts:
        raise ValueError(f"{setting} runs no test-time scaling")
    return TTSConfig(
        mode=setting.mode,  # type: ignore[arg-type]
        n=setting.n,
        rollout=rollout,
        attempt_max_tokens=int(tts["attempt_max_tokens"]),
        memory_max_tokens=int(tts["memory_max_tokens"]),
        eval_max_tokens=int(tts["eval_max_tokens"]),
        aux_max_context_tokens=int(tts["aux_max_context_tokens"]),
        aux_sampling=dict(tts["aux_sampling"]),
        prompt_name=str(tts["prompt"]),
    )
