"""Test-time scaling as an episode function of the evaluation runner (``run_samples``).

:func:`tts_episode_fn` wraps :func:`envace.core.tts.run_tts` for one TTS setting: the rehearser is forked
per task where it can fork (a served model: its requests seeded from ``(seed, task)``, so results do not
depend on the concurrency; several samples of one task share the rehearser's seeds), a model server's
failure stops the run (``BackendError``: resume later), and any other exception (e.g. the simulated
user's opening failed) becomes a failed sample marked as an exception, never a crash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from envace.common.settings import TTSSetting
from envace.core.episode import exception_result
from envace.core.rollout import BackendError, RolloutConfig
from envace.core.settings import tts_config
from envace.core.tts import run_tts

EpisodeFn = Callable[[Any, Any, Any, Any, RolloutConfig], Awaitable[dict[str, Any]]]


def tts_episode_fn(tts: Mapping[str, Any], setting: TTSSetting, rehearser: Any,
                   rehearser_tokenizer: Any) -> EpisodeFn:
    """The runner's ``episode_fn`` for ``setting`` (a TTS setting, not ``no_tts``) with the ``tts`` config
    block; ``rehearser`` answers the private attempts."""

    async def episode_fn(task: Any, episode: Any, backend: Any, tokenizer: Any,
                         config: RolloutConfig) -> dict[str, Any]:
        fork = getattr(rehearser, "for_sample", None)
        task_rehearser = fork(task.task_id, "rehearse") if fork is not None else rehearser
        try:
            result = await run_tts(task, episode, actor=backend, actor_tokenizer=tokenizer,
                                   rehearser=task_rehearser, rehearser_tokenizer=rehearser_tokenizer,
                                   config=tts_config(tts, setting, config))
        except BackendError:
            raise
        except Exception as exc:  # e.g. the simulated user's opening failed: a failed sample, never a crash
            return exception_result(exc, "tts")
        return result.fields

    return episode_fn
