"""The rollout settings of an evaluation, built in one place from the validated config.

:func:`evaluation_rollout` turns ``evaluation.sampling``, ``evaluation.episode`` and ``tts.rehearse`` into
the :class:`~envace.core.rollout.RolloutConfig` every evaluation and test-time-scaling run uses (REAL
mode; the REHEARSE settings act only inside TTS attempts). Training builds its own from verl's config
(:func:`envace.train.verl_ext.agent_loop.rollout_config_from`); the episode rules a training run omits
default to :data:`envace.common.settings.EPISODE_DEFAULTS`, which are also ``RolloutConfig``'s defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envace.core.rollout import Mode, RolloutConfig, template_kwargs

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
    )
