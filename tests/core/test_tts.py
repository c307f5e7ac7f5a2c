"""Test-time scaling (envace.core.tts): context contents, no real-environment call before the commit, token
caps, fallbacks, multi-turn commit and determinism with the tiny model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envace.core.tools import ToolCall
from envace.core.tts import (
    EVAL_FALLBACK_FEEDBACK,
    TTSConfig,
    cap_tokens,
    fallback_memory_suffixes,
    parse_evaluation,
    parse_memory,
    run_tts,
)
from envace.serve.tiny_model import HFGenerateBackend, tiny_model_and_tokenizer
from tests.fixtures import CALL, ScriptedBackend, SpyEpisode, eval_rules
from tests.fixtures import TtsTask as Task

TASK = Task(system="You are a weather assistant.", first_user="What is the weather in Paris?")
REH_RESULT = '<execution_result>{"temperature": 99}</execution_result>'
EVAL_1 = '<evaluation>{"success": false, "feedback": "FEEDBACK-ONE"}</evaluation>'
EVAL_2 = '<evaluation>{"success": true, "feedback": "FEEDBACK-TWO"}</evaluation>'
SUMMARY = "<memory>MEMORY-TEXT: call get_weather with city Paris.</memory>"
ATTEMPT_1 = [CALL, REH_RESULT, "It is 99 degrees. ATTEMPT-ONE-ANSWER"]
ATTEMPT_2 = ["ATTEMPT-TWO-ANSWER"]


def _run(tokenizer: Any, mode: str, rehearser_texts: list[str], actor_texts: list[str], *,
         n: int = 2, replies: list[str | None] | None = None, task: Task = TASK, **cfg: Any):
    log: list[tuple[str, Any]] = []
    rehearser = ScriptedBackend(tokenizer, rehearser_texts, name="rehearser", log=log)
    actor = ScriptedBackend(tokenizer, actor_texts, name="actor", log=log)
    episode = SpyEpisode(log, replies)
    config = TTSConfig(mode=mode, n=n, rollout=eval_rules(max_turns=4), **cfg)
    result = asyncio.run(run_tts(task, episode, actor=actor, actor_tokenizer=tokenizer, rehearser=rehearser,
                                 rehearser_tokenizer=tokenizer, config=config))
    assert not rehearser.texts and not actor.texts, "every scripted reply must be consumed"
    return result, log, rehearser, actor, episode


def _parallel(tokenizer: Any, **kw: Any):
    return _run(tokenizer, "parallel", ATTEMPT_1 + ATTEMPT_2 + [EVAL_1, EVAL_2, SUMMARY],
                [CALL, "It is 18 degrees."], **kw)


def _sequential(tokenizer: Any, **kw: Any):
    return _run(tokenizer, "sequential", ATTEMPT_1 + [EVAL_1] + ATTEMPT_2 + [EVAL_2, SUMMARY],
                [CALL, "It is 18 degrees."], **kw)


def test_parallel_attempts_are_independent(tokenizer):
    result, _, rehearser, actor, _ = _parallel(tokenizer)
    second_attempt_prompt = rehearser.prompts[3]
    assert "What is the weather in Paris?" in second_attempt_prompt
    assert "ATTEMPT-ONE-ANSWER" not in second_attempt_prompt
    assert "FEEDBACK-ONE" not in second_attempt_prompt
    rec = result.record
    assert [a.final_answer for a in rec.attempts] == ["It is 99 degrees. ATTEMPT-ONE-ANSWER",
                                                       "ATTEMPT-TWO-ANSWER"]
    assert [a.evaluation.success for a in rec.attempts] == [False, True]
    assert rec.attempts[0].prompt_tokens == rec.attempts[1].prompt_tokens
    assert rec.attempts[0].num_turns == 2 and rec.attempts[1].num_turns == 1
    assert [(a.rehearsed_calls, a.malformed_rehearsals) for a in rec.attempts] == [(1, 0), (0, 0)]
    # the summarizer sees both attempts and both reviews
    summary_prompt = rehearser.prompts[-1]
    for marker in ("ATTEMPT-ONE-ANSWER", "ATTEMPT-TWO-ANSWER", "FEEDBACK-ONE", "FEEDBACK-TWO", "99"):
        assert marker in summary_prompt
    # the commit sees the memory (system-prompt suffix), not the raw attempts
    commit_prompt = actor.prompts[0]
    assert "MEMORY-TEXT: call get_weather with city Paris." in commit_prompt
    assert commit_prompt.index("You are a weather assistant.") < commit_prompt.index("MEMORY-TEXT")
    assert commit_prompt.index("MEMORY-TEXT") < commit_prompt.index("What is the weather in Paris?")
    assert "ATTEMPT-TWO-ANSWER" not in commit_prompt
    assert rec.memory == "MEMORY-TEXT: call get_weather with city Paris."
    assert rec.memory_tokens == len(tokenizer.encode(rec.memory, add_special_tokens=False))
    assert not rec.memory_truncated and not rec.summary_fallback
    assert rec.as_dict()["fallbacks"] == {"evaluation": 0, "summary": 0}


def test_sequential_attempt_sees_earlier_attempts_and_feedback(tokenizer):
    result, _, rehearser, _, _ = _sequential(tokenizer)
    second_attempt_prompt = rehearser.prompts[4]
    assert "ATTEMPT-ONE-ANSWER" in second_attempt_prompt
    assert "FEEDBACK-ONE" in second_attempt_prompt
    assert "judged unsuccessful" in second_attempt_prompt
    assert "FEEDBACK-TWO" not in second_attempt_prompt
    # the first attempt's context had none of this, so the second's initial prompt is longer
    rec = result.record
    assert rec.attempts[1].prompt_tokens > rec.attempts[0].prompt_tokens
    parallel, *_ = _parallel(tokenizer)
    assert rec.attempts[1].prompt_tokens > parallel.record.attempts[1].prompt_tokens
    assert rec.attempts[0].prompt_tokens == parallel.record.attempts[0].prompt_tokens


@pytest.mark.parametrize("runner", [_parallel, _sequential])
def test_real_episode_untouched_before_commit(tokenizer, runner):
    result, log, _, actor, episode = runner(tokenizer)
    names = [name for name, _ in log]
    first_env = next(i for i, name in enumerate(names) if name.startswith("env."))
    first_actor = names.index("actor")
    # everything before the commit's first ACT turn is rehearsal; the rehearser never runs after it
    assert first_actor < first_env
    assert set(names[:first_actor]) == {"rehearser"} and "rehearser" not in names[first_actor:]
    assert names.count("env.step") == 1 and names[-1] == "env.score" and names.count("env.score") == 1
    assert episode.calls == [ToolCall("get_weather", {"city": "Paris"})]
    # the real observation, not the imagined one, reaches the commit
    fields = result.fields
    tool_obs = [m["content"] for m in fields["trajectory"]["messages"] if m["role"] == "tool"]
    assert tool_obs == ['{"temperature": 18}']
    assert (fields["status"], fields["score"], fields["extra"]["calls"]) == ("ok", 1.0, 1)
    rec = result.record
    assert fields["extra"]["tts"] == rec.as_dict()
    assert rec.commit_context_tokens == actor.context_lengths and len(actor.context_lengths) == 2
    assert rec.commit_final_context_tokens == actor.context_lengths[-1] > rec.commit_prompt_tokens > 0
    assert rec.as_dict()["attempt_context_tokens"] == [a.context_tokens for a in rec.attempts]


def test_attempt_token_cap(tokenizer):
    long_turn = "word " * 100
    result, _, rehearser, _, _ = _run(tokenizer, "parallel", [long_turn, EVAL_1, SUMMARY], ["done"], n=1,
                                      attempt_max_tokens=8)
    assert rehearser.params[0]["max_tokens"] == 8
    attempt = result.record.attempts[0]
    assert attempt.termination == "context_limit"
    assert attempt.context_tokens - attempt.prompt_tokens == 8
    assert len(tokenizer.encode(attempt.transcript, add_special_tokens=False)) <= 8
    assert attempt.transcript_truncated


def test_memory_token_cap(tokenizer):
    long_memory = "<memory>" + " ".join(f"step{i} call get_weather" for i in range(200)) + "</memory>"
    result, _, rehearser, actor, _ = _run(tokenizer, "parallel", ATTEMPT_2 + [EVAL_2, long_memory],
                                          ["done"], n=1, memory_max_tokens=20)
    rec = result.record
    assert rehearser.params[-1]["max_tokens"] == 20  # the summary itself is generated with the cap
    assert not rec.summary_fallback  # an unclosed block cut by the limit still counts
    assert rec.memory.startswith("step0 call") and "step199" not in rec.memory
    assert 0 < rec.memory_tokens <= 20
    assert rec.memory_tokens == len(tokenizer.encode(rec.memory, add_special_tokens=False))
    assert rec.memory in actor.prompts[0]


def test_fallback_memory_is_capped(tokenizer):
    long_eval = '<evaluation>{"success": true, "feedback": "' + "very long feedback " * 50 + '"}</evaluation>'
    result, _, _, actor, _ = _run(tokenizer, "parallel", ATTEMPT_2 + [long_eval, "no tags"], ["done"], n=1,
                                  memory_max_tokens=20)
    rec = result.record
    assert rec.summary_fallback and rec.memory_truncated
    assert 0 < rec.memory_tokens <= 20
    assert rec.memory_tokens == len(tokenizer.encode(rec.memory, add_special_tokens=False))
    assert rec.memory.startswith("- Rehearsal 1 (judged successful")
    assert rec.memory in actor.prompts[0] and "very long feedback " * 10 not in actor.prompts[0]


def test_fallbacks_are_defined_and_counted(tokenizer):
    result, _, _, actor, _ = _run(tokenizer, "sequential",
                                  ATTEMPT_1 + ["this is not an evaluation"] + ATTEMPT_2
                                  + [EVAL_2, "I forgot the tags."], ["done"])
    rec = result.record
    first, second = rec.attempts
    assert first.evaluation.fallback and first.evaluation.success is None
    assert first.evaluation.feedback == EVAL_FALLBACK_FEEDBACK
    assert not second.evaluation.fallback
    assert rec.summary_fallback and rec.summary_text == "I forgot the tags."
    assert rec.as_dict()["fallbacks"] == {"evaluation": 1, "summary": 1}
    # the fallback memory is the digest of attempts and reviews
    assert "Rehearsal 1 (no usable review" in rec.memory and "FEEDBACK-TWO" in rec.memory
    assert "ATTEMPT-TWO-ANSWER" in rec.memory
    assert rec.memory in actor.prompts[0]


@pytest.mark.parametrize("n", [1, 2])
def test_fallback_memory_suffixes_are_what_the_commit_appends(tokenizer, n):
    """The warm start's ``memory`` rows use :func:`fallback_memory_suffixes`: it must be, text for text,
    what a commit appends when no review and no summary is usable and every attempt answered."""
    answers = ["ATTEMPT-ONE-ANSWER", "ATTEMPT-TWO-ANSWER"][:n]
    rehearser = [t for a in answers for t in ([a, "not a review"])] + ["no memory tags"]
    result, _, _, actor, _ = _run(tokenizer, "sequential", rehearser, ["done"], n=n)
    assert result.record.as_dict()["fallbacks"] == {"evaluation": n, "summary": 1}
    expected = "<|im_start|>system\n" + TASK.system + fallback_memory_suffixes(answers)[-1]
    assert actor.prompts[0].startswith(expected)
    assert actor.prompts[0][len(expected):].startswith("\n\n# Tools")  # the memory ends there


def test_aux_prompt_over_limit_falls_back(tokenizer):
    result, _, rehearser, _, _ = _run(tokenizer, "parallel", ATTEMPT_2, ["done"], n=1,
                                      aux_max_context_tokens=50)
    rec = result.record
    assert len(rehearser.prompts) == 1  # neither the review nor the summary was generated
    assert rec.attempts[0].evaluation.reason == "prompt too long"
    assert rec.summary_fallback_reason == "prompt too long" and rec.summary_text is None


def test_multi_turn_commit_uses_user_replies(tokenizer):
    result, log, _, actor, _ = _run(tokenizer, "parallel", ATTEMPT_2 + [EVAL_2, SUMMARY],
                                    [CALL, "answer one", "answer two"], n=1,
                                    replies=["USER-FOLLOW-UP", None])
    assert [e for e in log if e[0] == "env.user_reply"] == [("env.user_reply", "answer one"),
                                                            ("env.user_reply", "answer two")]
    assert result.fields["trajectory"]["terminations"] == ["final_answer", "final_answer"]
    contents = [m.get("content") for m in result.fields["trajectory"]["messages"]]
    assert "USER-FOLLOW-UP" in contents and contents[-1] == "answer two"
    assert "MEMORY-TEXT" in actor.prompts[-1] and "USER-FOLLOW-UP" in actor.prompts[-1]
    lengths = result.record.commit_context_tokens
    assert lengths == actor.context_lengths and lengths[0] < lengths[1] < lengths[2]
    assert result.record.commit_final_context_tokens == lengths[-1]


def test_task_without_system_prompt_gets_memory_as_system(tokenizer):
    task = Task(system=None, first_user="What is the weather in Paris?")
    _, _, _, actor, _ = _run(tokenizer, "parallel", ATTEMPT_2 + [EVAL_2, SUMMARY], ["done"], n=1, task=task)
    assert actor.prompts[0].startswith("<|im_start|>system\n# Rehearsal memory")


def test_parsers():
    assert parse_evaluation('<think>hmm</think><evaluation>{"success": true, "feedback": " ok "}'
                            '</evaluation>').feedback == "ok"
    for bad in ('<evaluation>{"success": "yes", "feedback": "x"}</evaluation>',
                "<evaluation>{not json}</evaluation>", '{"success": true, "feedback": "x"}',
                '<evaluation>[true, "x"]</evaluation>'):
        assert parse_evaluation(bad).fallback, bad
    assert parse_memory("<memory> a </memory> trailing") == "a"
    assert parse_memory("<memory>cut off") == "cut off"
    assert parse_memory("<memory>  </memory>") is None and parse_memory("none") is None


def test_cap_tokens(tokenizer):
    text = "The order 12345 was cancelled; the refund will arrive within 5 business days. " * 5
    n = len(tokenizer.encode(text, add_special_tokens=False))
    assert cap_tokens(tokenizer, text, n) == (text, n, False)
    for cap in (1, 7, n - 1):
        cut, k, truncated = cap_tokens(tokenizer, text, cap)
        assert truncated and k <= cap and k == len(tokenizer.encode(cut, add_special_tokens=False))
        assert text.startswith(cut)


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        TTSConfig(mode="beam", n=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n >= 1"):
        TTSConfig(mode="parallel", n=0)
    with pytest.raises(ValueError, match="memory_max_tokens"):
        TTSConfig(mode="parallel", n=1, memory_max_tokens=0)


def test_tiny_model_is_deterministic():
    model, tok = tiny_model_and_tokenizer(seed=0)
    eos = [tok.eos_token_id]

    def once() -> dict[str, Any]:
        log: list[tuple[str, Any]] = []
        rollout = eval_rules(max_turns=2, act_sampling={"temperature": 1.0, "max_tokens": 16},
                                rehearse_sampling={"temperature": 1.0, "max_tokens": 12})
        config = TTSConfig(mode="sequential", n=2, attempt_max_tokens=16, memory_max_tokens=12,
                           eval_max_tokens=12, rollout=rollout)
        result = asyncio.run(run_tts(TASK, SpyEpisode(log), actor=HFGenerateBackend(model, eos, seed=1),
                                     actor_tokenizer=tok, rehearser=HFGenerateBackend(model, eos, seed=2),
                                     rehearser_tokenizer=tok, config=config))
        return {"fields": result.fields, "log": log}

    first, second = once(), once()
    assert first == second
    rec = first["fields"]["extra"]["tts"]
    assert len(rec["attempts"]) == 2
    # random bytes never form a valid review: every review fell back and was counted
    assert rec["fallbacks"]["evaluation"] == 2
    assert rec["memory_tokens"] <= 12


class _DeadBackend:
    async def generate(self, prompt_ids, sampling_params):
        raise ConnectionError("server gone")


class _BrokenEpisode(SpyEpisode):
    def step(self, call: ToolCall) -> str:
        raise RuntimeError("environment bug")


def test_rehearser_failure_stops_the_run(tokenizer):
    from envace.core.rollout import BackendError

    log: list[tuple[str, Any]] = []
    episode = SpyEpisode(log)
    with pytest.raises(BackendError, match="rehearser backend failed: server gone"):
        asyncio.run(run_tts(TASK, episode, actor=ScriptedBackend(tokenizer, [], name="actor", log=log),
                            actor_tokenizer=tokenizer, rehearser=_DeadBackend(),
                            rehearser_tokenizer=tokenizer, config=TTSConfig(mode="parallel", n=2)))
    assert log == []  # nothing reached the real episode


def test_environment_error_in_commit_is_a_failed_sample_with_the_record(tokenizer):
    log: list[tuple[str, Any]] = []
    result = asyncio.run(run_tts(
        TASK, _BrokenEpisode(log), actor=ScriptedBackend(tokenizer, [CALL], name="actor", log=log),
        actor_tokenizer=tokenizer,
        rehearser=ScriptedBackend(tokenizer, ATTEMPT_2 + [EVAL_2, SUMMARY], name="rehearser", log=log),
        rehearser_tokenizer=tokenizer, config=TTSConfig(mode="sequential", n=1)))
    fields = result.fields
    assert fields["status"] == "failed" and fields["score"] == 0.0
    assert fields["reason"] == "episode: RuntimeError: environment bug"
    assert fields["extra"]["exception"] == {"type": "RuntimeError", "where": "episode"}
    assert result.record.memory.startswith("MEMORY-TEXT")


def test_commit_in_a_real_bfcl_episode_scores_like_the_gold_replay(tmp_path, monkeypatch):
    """The commit path with a real executable environment: rehearsal by a scripted rehearser, then the
    gold calls executed once in a real BFCL multi-turn episode (wrapped in a spy), scored 1.0."""
    pytest.importorskip("bfcl_eval")
    monkeypatch.setenv("BFCL_PROJECT_ROOT", str(tmp_path))
    from envace.bench.bfcl.adapter import BfclMultiTurnAdapter
    from envace.bench.scripted import CharTokenizer, script_for_calls
    from envace.bench.scripted import ScriptedBackend as CharScripted
    from envace.core.environment import Services

    class Spy:
        def __init__(self, inner: Any, log: list[str]) -> None:
            self.inner, self.log = inner, log

        def step(self, call: ToolCall) -> str:
            self.log.append("step")
            return self.inner.step(call)

        def user_reply(self, text: str) -> str | None:
            self.log.append("user_reply")
            return self.inner.user_reply(text)

        def score(self) -> Any:
            self.log.append("score")
            return self.inner.score()

        def current_tools(self) -> list[dict[str, Any]]:
            return self.inner.current_tools()

    class LoggedRehearser(CharScripted):
        def __init__(self, script: list[str], tok: Any, log: list[str]) -> None:
            super().__init__(script, tok)
            self.log = log

        async def generate(self, prompt_ids, sampling_params):
            self.log.append("rehearser")
            return await super().generate(prompt_ids, sampling_params)

    adapter = BfclMultiTurnAdapter()
    tok = CharTokenizer()
    roomy = eval_rules(max_turns=200, max_prompt_tokens=10**7, max_response_tokens=10**7,
                          act_sampling={"max_tokens": 10**6})
    for task in adapter.load_tasks(["multi_turn_base"], 2):
        log: list[str] = []
        episode = Spy(adapter.new_episode(task, 0, 0, Services(None, None)), log)
        rehearser = LoggedRehearser(["my answer", EVAL_2, SUMMARY], tok, log)
        actor = CharScripted(script_for_calls(adapter.gold_turns(task)), tok)
        config = TTSConfig(mode="sequential", n=1, rollout=roomy, memory_max_tokens=10**5,
                           aux_max_context_tokens=10**7)
        result = asyncio.run(run_tts(task, episode, actor=actor, actor_tokenizer=tok, rehearser=rehearser,
                                     rehearser_tokenizer=tok, config=config))
        assert (result.fields["status"], result.fields["score"]) == ("ok", 1.0), result.fields["reason"]
        assert log[:3] == ["rehearser"] * 3 and "rehearser" not in log[3:] and log[-1] == "score"
        assert "step" in log and "user_reply" in log
        assert result.record.memory == "MEMORY-TEXT: call get_weather with city Paris."
        assert "MEMORY-TEXT" in result.fields["trajectory"]["messages"][0]["content"]


class _SeededScript(ScriptedBackend):
    """A scripted rehearser that records the seed of every request, forked as a served backend forks."""

    def __init__(self, tokenizer: Any, texts: list[str], seeds: list[tuple[Any, ...]], key: tuple = (),
                 forks: list[tuple[Any, ...]] | None = None):
        super().__init__(tokenizer, texts, name="rehearser", log=[])
        self.seeds, self.key = seeds, key
        self.forks = [] if forks is None else forks

    def for_sample(self, *key: object) -> _SeededScript:
        fork = _SeededScript(self.tokenizer, [], self.seeds, (*self.key, *key), self.forks)
        fork.texts = self.texts  # one script, consumed in call order by every fork
        self.forks.append(fork.key)
        return fork

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]):
        self.seeds.append(self.key)
        return await super().generate(prompt_ids, sampling_params)


def test_a_malformed_rehearsal_is_counted_in_its_attempt(tokenizer):
    """An attempt whose rehearser answers a call without an <execution_result> ends there (as in
    training); its record counts the answered call and the malformed reply."""
    result, *_ = _run(tokenizer, "parallel", [CALL, "no tags here", EVAL_1, SUMMARY],
                      [CALL, "It is 18 degrees."], n=1)
    (attempt,) = result.record.attempts
    assert attempt.termination == "rehearsal_malformed"
    assert (attempt.rehearsed_calls, attempt.malformed_rehearsals) == (1, 1)
    assert result.record.as_dict()["attempts"][0]["malformed_rehearsals"] == 1


def test_parallel_attempts_draw_from_their_own_forks(tokenizer):
    """Each parallel attempt (rollout and self-evaluation) asks a fork keyed by its index; the summary
    asks the session's rehearser: no seed depends on the order concurrent attempts reach the server."""
    seeds: list[tuple[Any, ...]] = []
    rehearser = _SeededScript(tokenizer, ATTEMPT_1 + ATTEMPT_2 + [EVAL_1, EVAL_2, SUMMARY], seeds)
    actor = ScriptedBackend(tokenizer, ["done"], name="actor", log=[])
    asyncio.run(run_tts(TASK, SpyEpisode([], None), actor=actor, actor_tokenizer=tokenizer,
                        rehearser=rehearser, rehearser_tokenizer=tokenizer,
                        config=TTSConfig(mode="parallel", n=2, rollout=eval_rules(max_turns=4))))
    assert set(seeds) == {("attempt", 0), ("attempt", 1), ()}
    assert seeds[-1] == () and seeds.count(()) == 1  # the summary
    # one fork per attempt: its self-evaluation goes on from the attempt's requests (a fresh fork would
    # start its request count, and so its seeds, again)
    assert sorted(rehearser.forks) == [("attempt", 0), ("attempt", 1)]
