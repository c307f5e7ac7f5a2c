"""Test-time scaling by private rehearsal (paper, Table 3 and Figure 6).

Implemented, for one task (:func:`run_tts`):

1. **Attempts.** ``N`` imagined trajectories, each one :func:`envace.core.rollout.run_rollout` in
   ``rehearsal`` mode with the **rehearser** model as both ACT and REHEARSE of the imagination (so the
   base-model control of Table 3 is "another model rehearses"). No environment is passed: rehearsal can
   not reach the real episode. An attempt ends at the first final answer (there is no user simulator in
   the imagination) or at any other :class:`envace.core.rollout.Termination`; its ACT output after the
   initial prompt is capped at ``attempt_max_tokens`` (``RolloutConfig.max_response_tokens``).
   - ``parallel``: attempts are independent, each from the task's own messages (run concurrently with
     ``asyncio.gather``; with backends that never suspend they run in index order). A served rehearser
     is forked per attempt (``for_sample("attempt", i)``), so an attempt's sampling seeds do not depend
     on which concurrent request reaches the server first.
   - ``sequential``: attempt ``n``'s system prompt is the task's system prompt plus the
     ``previous_attempts`` section listing attempts ``< n`` with their self-evaluations, so its context
     grows with ``n`` (what the paper blames for the N = 3 drop).
2. **Self-evaluation.** After each attempt the rehearser, in a fresh chat (``eval_system`` /
   ``eval_user`` of ``envace/core/prompts/tts_v1.yaml``), reviews the attempt's transcript and answers
   ``<evaluation>{"success": bool, "feedback": str}</evaluation>``.
3. **Summarization.** The rehearser condenses all attempts and reviews (``summary_system`` /
   ``summary_user``) into ``<memory>...</memory>``: the rehearsal memory, then cut to
   ``memory_max_tokens`` tokens of the **actor's** tokenizer (the context it enters).
4. **Commit.** The actor executes **once** in the real episode, through the evaluation runner's own
   :func:`envace.core.episode.run_episode` (the same protocol as without TTS: ``real`` rollout, user
   replies, turn budget, ``episode.score()``, failed-sample rules) on a copy of the task whose system
   prompt has the memory **appended** (``memory_suffix``; a system message is created when the task has
   none), so the first user message and the user-simulator conversation stay as without TTS.

Fallbacks (each counted in the record): an unparsable self-evaluation (no block, invalid JSON, wrong
field types) or one whose prompt exceeds ``aux_max_context_tokens`` becomes
``{"success": None, "feedback": "(no usable self-evaluation)"}``; an unparsable or empty summary (or an
over-long summary prompt) becomes a deterministic digest of the attempts (each attempt's verdict,
feedback and final answer), which is then capped like any memory.

Recorded (:class:`TTSRecord`, JSON-able via ``as_dict``): per attempt the initial prompt length, the
final ACT context length, the longest REHEARSE context, generated tokens, termination, transcript, the
calls the rehearser answered and how many of its replies were malformed, and the self-evaluation; the
memory and its token count; the summary; the commit's context length at every ACT generation (prompt +
reply, measured on the token ids sent to the actor) and at the end; fallback counts.
:attr:`TTSResult.fields` are the result-line fields of :func:`run_episode` with the record added as
``extra["tts"]``. The self-evaluation and memory parsers scan with ``str.find`` (linear in the reply)
and decode JSON with :func:`envace.core.tools.load_model_json`, so no reply can raise or stall them.

A backend that fails while rehearsing (``OSError`` / ``ConnectionError``) raises
:class:`envace.core.rollout.BackendError`, as the runner does for the actor: the run stops and the sample
is retried on resume.

Simplifications (ours): transcripts shown to the self-evaluation, the summarizer and later sequential
attempts are plain text (role headers, calls as JSON), each cut to ``attempt_max_tokens`` tokens of the
rehearser's tokenizer; token cuts happen at token boundaries without a marker (``*_truncated`` flags
say where). Imagined attempts get no privileged references. Verified on CPU with scripted backends and
the tiny model (tests/core); not yet run at paper scale.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

from envace.core.episode import run_episode
from envace.core.prompts import load_prompt
from envace.core.rehearsal import OutcomeKind
from envace.core.rollout import BackendError, GenerateBackend, Mode, RolloutConfig, Termination, run_rollout
from envace.core.tools import (
    ChatTemplateTokenizer,
    find_block,
    load_model_json,
    render_chat,
    strip_think,
    transcript,
)

__all__ = [
    "PROMPT_FIELDS",
    "EVAL_FALLBACK_FEEDBACK",
    "TaskLike",
    "TTSConfig",
    "fallback_memory_suffixes",
    "Evaluation",
    "AttemptRecord",
    "TTSRecord",
    "TTSResult",
    "parse_evaluation",
    "parse_memory",
    "cap_tokens",
    "transcript",
    "run_tts",
]

PROMPT_FIELDS = ("eval_system", "eval_user", "summary_system", "summary_user", "attempt_block",
                 "previous_attempts", "memory_suffix")
EVAL_FALLBACK_FEEDBACK = "(no usable self-evaluation)"



class TaskLike(Protocol):
    """The fields of ``envace.core.environment.Task`` that TTS reads (a dataclass: the commit uses a copy with
    another system prompt)."""

    system: str | None
    first_user: str
    tools: list[dict[str, Any]]


@dataclass
class TTSConfig:
    """Test-time-scaling settings.

    ``rollout``: the base rollout settings (sampling, turn limit, ...) for both attempts and commit;
    attempts override ``mode`` (rehearsal) and cap ``max_response_tokens`` at ``attempt_max_tokens``;
    the commit overrides ``mode`` (real). ``aux_sampling``: sampling of self-evaluation and summary
    (our choice: the paper's validation temperature / top-p). ``aux_max_context_tokens``: the longest
    self-evaluation / summary prompt plus output allowed (longer = fallback).
    """

    mode: Literal["parallel", "sequential"]
    n: int
    attempt_max_tokens: int = 16384  # config tts.attempt_max_tokens (our choice)
    memory_max_tokens: int = 4096  # config tts.memory_max_tokens (our choice)
    eval_max_tokens: int = 1024  # our choice
    aux_max_context_tokens: int = 32768  # our choice
    prompt_name: str = "tts_v1"
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    aux_sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.6, "top_p": 0.95})

    def __post_init__(self) -> None:
        if self.mode not in ("parallel", "sequential"):
            raise ValueError(f"tts mode must be 'parallel' or 'sequential', got {self.mode!r}")
        if self.n < 1:
            raise ValueError(f"tts needs n >= 1 attempts, got {self.n}")
        for name in ("attempt_max_tokens", "memory_max_tokens", "eval_max_tokens", "aux_max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"tts {name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Evaluation:
    """A self-evaluation: ``success`` (``None`` = fallback), ``feedback`` text, ``fallback`` flag and why."""

    success: bool | None
    feedback: str
    fallback: bool = False
    reason: str | None = None


@dataclass
class AttemptRecord:
    """One imagined attempt and its self-evaluation (token counts in the rehearser's tokenizer)."""

    index: int
    termination: str
    num_turns: int
    prompt_tokens: int  # initial ACT prompt of the attempt
    context_tokens: int  # final ACT context (prompt + everything generated / observed)
    rehearse_context_tokens: int  # longest REHEARSE context (prompt + reply); 0 if nothing was rehearsed
    generated_tokens: int  # ACT + REHEARSE tokens generated
    final_answer: str | None
    transcript: str
    transcript_truncated: bool
    evaluation: Evaluation
    eval_prompt_tokens: int
    rehearsed_calls: int = 0  # calls the rehearser answered in this attempt
    malformed_rehearsals: int = 0  # of those, replies without a parseable <execution_result>


@dataclass
class TTSRecord:
    """Everything a result line records about one TTS episode (``as_dict`` for JSON)."""

    mode: str
    n: int
    prompt_version: str
    attempts: list[AttemptRecord]
    summary_text: str | None  # raw summarizer output (None if it was not run)
    summary_prompt_tokens: int
    summary_fallback: bool
    summary_fallback_reason: str | None
    memory: str
    memory_tokens: int  # in the actor's tokenizer, <= memory_max_tokens
    memory_truncated: bool
    memory_placement: str
    commit_context_tokens: list[int]  # prompt + reply of every ACT generation of the commit, in order
    commit_prompt_tokens: int  # the commit's first prompt (task + memory + tools); 0 if never generated
    commit_final_context_tokens: int  # prompt + reply of its last generation; 0 if never generated

    @property
    def evaluation_fallbacks(self) -> int:
        return sum(a.evaluation.fallback for a in self.attempts)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fallbacks"] = {"evaluation": self.evaluation_fallbacks, "summary": int(self.summary_fallback)}
        out["attempt_context_tokens"] = [a.context_tokens for a in self.attempts]
        return out


@dataclass
class TTSResult:
    """``fields``: the result-line fields of the commit (``score, subscores, status, reason, trajectory,
    extra``, as :func:`envace.core.episode.run_episode` returns them, plus ``extra["tts"]`` = the record
    as a dict); ``record``: the :class:`TTSRecord`."""

    fields: dict[str, Any]
    record: TTSRecord


class _MeasuredBackend:
    """Wraps the actor's backend and records ``len(prompt) + len(reply)`` of every generation."""

    def __init__(self, inner: GenerateBackend) -> None:
        self.inner = inner
        self.prompt_lengths: list[int] = []
        self.context_lengths: list[int] = []

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        ids, logprobs = await self.inner.generate(prompt_ids, sampling_params)
        self.prompt_lengths.append(len(prompt_ids))
        self.context_lengths.append(len(prompt_ids) + len(ids))
        return ids, logprobs


def _after_think(text: str) -> str:
    """``text`` without its complete think blocks (:func:`envace.core.tools.strip_think`); all of it when
    the tags are unbalanced."""
    stripped = strip_think(text)
    return text if stripped is None else stripped


def parse_evaluation(text: str) -> Evaluation:
    """Parse a self-evaluation reply; never raises. Anything but a well-formed block is a fallback."""
    block = find_block(_after_think(text), "<evaluation>", "</evaluation>")
    if block is None:
        return Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, "no <evaluation> block")
    value, problem = load_model_json(block)
    if problem is not None:
        return Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, f"invalid JSON ({problem})")
    if not isinstance(value, dict) or not isinstance(value.get("success"), bool) \
            or not isinstance(value.get("feedback"), str):
        return Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, "needs boolean 'success' and string 'feedback'")
    return Evaluation(value["success"], value["feedback"].strip())


def parse_memory(text: str) -> str | None:
    """The stripped text of the first ``<memory>`` block, or ``None`` if absent or empty.

    An unclosed block at the end (the summary hit its token limit) counts: its text runs to the end.
    """
    body = _after_think(text)
    start = body.find("<memory>")
    if start == -1:
        return None
    block = find_block(body, "<memory>", "</memory>")
    if block is None:
        block = body[start + len("<memory>") :]
    return block.strip() or None


def cap_tokens(tokenizer: ChatTemplateTokenizer, text: str, max_tokens: int) -> tuple[str, int, bool]:
    """Cut ``text`` so that it encodes to at most ``max_tokens`` ids; returns ``(text, n_tokens, cut)``.

    The cut is at a token boundary; since decoding a prefix and re-encoding it can change the count, the
    prefix shrinks until the re-encoded text fits.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, len(ids), False
    keep = max_tokens
    while keep > 0:
        cut = tokenizer.decode(ids[:keep], skip_special_tokens=False)
        n = len(tokenizer.encode(cut, add_special_tokens=False))
        if n <= max_tokens:
            return cut, n, True
        keep -= max(1, n - max_tokens)
    return "", 0, True


def _task_messages(task: TaskLike, system_suffix: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = (task.system or "") + system_suffix
    if task.system is None and system_suffix:
        system = system_suffix.lstrip("\n")
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": task.first_user})
    return messages


def _task_text(task: TaskLike) -> str:
    if task.system:
        return f"{task.system}\n\n[user]\n{task.first_user}"
    return task.first_user


def _tools_text(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) or "(none)"


def _verdict(evaluation: Evaluation) -> str:
    if evaluation.success is None:
        return "no usable review"
    return "judged successful" if evaluation.success else "judged unsuccessful"


def fallback_memory_suffixes(final_answers: list[str | None], prompt_name: str = "tts_v1") -> list[str]:
    """The system-prompt suffixes a commit's actor sees after ``k = 1 .. len(final_answers)`` attempts
    whose rehearser wrote no usable self-evaluation nor summary (a model too small for those prompts,
    such as the smoke model): ``memory_suffix`` around the digest of the first ``k`` attempts, each ended
    by a final answer. The smoke model's warm start (``envace.train.warmstart``, behaviour ``memory``)
    trains acting rows under them, so that the commit is in distribution."""
    text = load_prompt(prompt_name, required=PROMPT_FIELDS)["memory_suffix"]
    fallback = Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, "no <evaluation> block")
    attempts = [AttemptRecord(index=i, termination=str(Termination.FINAL_ANSWER), num_turns=1,
                              prompt_tokens=0, context_tokens=0, rehearse_context_tokens=0,
                              generated_tokens=0, final_answer=a,
                              transcript="", transcript_truncated=False, evaluation=fallback,
                              eval_prompt_tokens=0)
                for i, a in enumerate(final_answers)]
    return [text.format(memory=_Session.digest(attempts[:k])) for k in range(1, len(attempts) + 1)]


class _Session:
    """The state of one TTS episode (internal)."""

    def __init__(self, task: TaskLike, actor_tokenizer: ChatTemplateTokenizer, rehearser: GenerateBackend,
                 rehearser_tokenizer: ChatTemplateTokenizer, config: TTSConfig) -> None:
        self.task = task
        self.actor_tok = actor_tokenizer
        self.rehearser, self.reh_tok = rehearser, rehearser_tokenizer
        self.config = config
        data = load_prompt(config.prompt_name, required=PROMPT_FIELDS)
        self.version: str = data["version"]
        self.text: dict[str, str] = {key: data[key] for key in PROMPT_FIELDS}
        base = config.rollout
        cap = min(base.max_response_tokens, config.attempt_max_tokens)
        self.attempt_cfg = replace(base, mode=Mode.REHEARSAL, max_response_tokens=cap)
        self.commit_cfg = replace(base, mode=Mode.REAL)
        self.task_text = _task_text(task)
        self.tools_text = _tools_text(task.tools)
        self._forks: dict[int, GenerateBackend] = {}

    def _rehearser_for(self, index: int) -> GenerateBackend:
        """The backend of attempt ``index``: in parallel mode a fork seeded from the attempt's index where
        the backend can fork (``for_sample``, a served model), so which seed an attempt's requests get
        does not depend on which concurrent attempt asks first; else the session's rehearser (sequential
        attempts ask in order). One fork per attempt, made once: its self-evaluation goes on from the
        attempt's request count (a second fork would repeat the attempt's first seed)."""
        fork = getattr(self.rehearser, "for_sample", None)
        if self.config.mode != "parallel" or fork is None:
            return self.rehearser
        if index not in self._forks:
            self._forks[index] = fork("attempt", index)
        return self._forks[index]

    async def _aux(self, system: str, user: str, max_tokens: int,
                   backend: GenerateBackend | None = None) -> tuple[str | None, int]:
        """One fresh-chat generation by ``backend`` (default: the rehearser); ``(None, prompt_len)`` if it
        does not fit."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        ids = render_chat(self.reh_tok, messages, add_generation_prompt=True, tokenize=True,
                          **self.config.rollout.template_kwargs)
        assert isinstance(ids, list)
        if len(ids) + max_tokens > self.config.aux_max_context_tokens:
            return None, len(ids)
        params = dict(self.config.aux_sampling)
        params["max_tokens"] = max_tokens
        out, _ = await (backend or self.rehearser).generate(list(ids), params)
        end = self.reh_tok.encode(getattr(self.reh_tok, "eos_token", None) or "", add_special_tokens=False)
        if end and out[-len(end):] == end:
            out = out[: -len(end)]
        return self.reh_tok.decode(out, skip_special_tokens=False), len(ids)

    async def attempt(self, index: int, previous: list[AttemptRecord]) -> AttemptRecord:
        suffix = ""
        if previous:
            suffix = self.text["previous_attempts"].format(attempts=self._blocks(previous))
        messages = _task_messages(self.task, suffix)
        traj = await run_rollout(self._rehearser_for(index), self.reh_tok, messages, self.task.tools,
                                 self.attempt_cfg)
        attempt = transcript(traj.messages[len(messages):], separator="\n", empty="(nothing)",
                             name_tools=True)
        text, _, cut = cap_tokens(self.reh_tok, attempt, self.config.attempt_max_tokens)
        rehearse = [g.prompt_len + len(g.response_ids) for g in traj.generations if g.role == "rehearse"]
        record = AttemptRecord(
            index=index, termination=str(traj.termination), num_turns=traj.num_turns,
            prompt_tokens=traj.act_segments[0][1], context_tokens=len(traj.act_ids),
            rehearse_context_tokens=max(rehearse, default=0),
            generated_tokens=sum(len(g.response_ids) for g in traj.generations),
            final_answer=traj.final_answer, transcript=text, transcript_truncated=cut,
            evaluation=Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, "not evaluated"), eval_prompt_tokens=0,
            rehearsed_calls=len(traj.rehearsed),
            malformed_rehearsals=sum(o.kind == OutcomeKind.MALFORMED for _, o in traj.rehearsed),
        )
        return record

    async def evaluate(self, record: AttemptRecord) -> None:
        user = self.text["eval_user"].format(task=self.task_text, tools=self.tools_text,
                                             transcript=record.transcript, termination=record.termination)
        reply, prompt_len = await self._aux(self.text["eval_system"].format(), user,
                                            self.config.eval_max_tokens, self._rehearser_for(record.index))
        record.eval_prompt_tokens = prompt_len
        if reply is None:
            record.evaluation = Evaluation(None, EVAL_FALLBACK_FEEDBACK, True, "prompt too long")
        else:
            record.evaluation = parse_evaluation(reply)

    def _blocks(self, attempts: list[AttemptRecord]) -> str:
        return "\n\n".join(
            self.text["attempt_block"].format(index=a.index + 1, transcript=a.transcript,
                                              termination=a.termination, verdict=_verdict(a.evaluation),
                                              feedback=a.evaluation.feedback)
            for a in attempts
        )

    @staticmethod
    def digest(attempts: list[AttemptRecord]) -> str:
        """The deterministic fallback memory: one line per attempt."""
        return "\n".join(
            f"- Rehearsal {a.index + 1} ({_verdict(a.evaluation)}; ended: {a.termination}): "
            f"{a.evaluation.feedback} Final answer: {a.final_answer or '(none)'}"
            for a in attempts
        )

    async def summarize(self, attempts: list[AttemptRecord]) -> tuple[str, str | None, int, str | None]:
        """``(memory before capping, raw summary, prompt tokens, fallback reason or None)``."""
        user = self.text["summary_user"].format(task=self.task_text, tools=self.tools_text,
                                                attempts=self._blocks(attempts))
        reply, prompt_len = await self._aux(self.text["summary_system"].format(), user,
                                            self.config.memory_max_tokens)
        if reply is None:
            return self.digest(attempts), None, prompt_len, "prompt too long"
        memory = parse_memory(reply)
        if memory is None:
            return self.digest(attempts), reply, prompt_len, "no non-empty <memory> block"
        return memory, reply, prompt_len, None

    async def commit(self, memory: str, episode: Any, actor: _MeasuredBackend) -> dict[str, Any]:
        system = _task_messages(self.task, self.text["memory_suffix"].format(memory=memory))[0]["content"]
        task = dataclasses.replace(self.task, system=system)  # type: ignore[type-var]
        return await run_episode(task, episode, actor, self.actor_tok, self.commit_cfg)


async def run_tts(
    task: TaskLike,
    episode: Any,
    *,
    actor: GenerateBackend,
    actor_tokenizer: ChatTemplateTokenizer,
    rehearser: GenerateBackend,
    rehearser_tokenizer: ChatTemplateTokenizer,
    config: TTSConfig,
) -> TTSResult:
    """Rehearse ``config.n`` times privately, summarize, then commit once in ``episode``.

    Args:
        task: system prompt, first user message and tools (``envace.core.environment.Task``).
        episode: the real environment (``envace.core.environment.Episode``); untouched until the commit.
        actor: the model that commits (ACT in the real episode); ``actor_tokenizer`` its tokenizer.
        rehearser: the model that rehearses, self-evaluates and summarizes (the actor itself for
            "EnvACE rehearsal", the base model for the control); ``rehearser_tokenizer`` its tokenizer.
        config: :class:`TTSConfig`.
    """
    opener = getattr(episode, "first_user_message", None)
    if callable(opener):  # a simulated user opens the conversation (tau2): rehearse against its message
        task = dataclasses.replace(task, first_user=opener())
    s = _Session(task, actor_tokenizer, rehearser, rehearser_tokenizer, config)
    try:
        attempts, raw_memory, summary, summary_prompt, reason = await _rehearse(s)
    except (OSError, ConnectionError) as exc:
        raise BackendError(f"rehearser backend failed: {exc}") from exc
    memory, memory_tokens, memory_cut = cap_tokens(actor_tokenizer, raw_memory, config.memory_max_tokens)
    measured = _MeasuredBackend(actor)
    fields = await s.commit(memory, episode, measured)
    record = TTSRecord(
        mode=config.mode, n=config.n, prompt_version=s.version, attempts=attempts, summary_text=summary,
        summary_prompt_tokens=summary_prompt, summary_fallback=reason is not None,
        summary_fallback_reason=reason, memory=memory, memory_tokens=memory_tokens,
        memory_truncated=memory_cut, memory_placement="system_suffix",
        commit_context_tokens=list(measured.context_lengths),
        commit_prompt_tokens=measured.prompt_lengths[0] if measured.prompt_lengths else 0,
        commit_final_context_tokens=measured.context_lengths[-1] if measured.context_lengths else 0,
    )
    fields = {**fields, "extra": {**fields.get("extra", {}), "tts": record.as_dict()}}
    return TTSResult(fields, record)


async def _rehearse(s: _Session) -> tuple[list[AttemptRecord], str, str | None, int, str | None]:
    """Attempts, self-evaluations and summary: ``(attempts, memory before capping, raw summary, summary
    prompt tokens, summary fallback reason)``."""
    attempts: list[AttemptRecord] = []
    if s.config.mode == "parallel":
        attempts = list(await asyncio.gather(*(s.attempt(i, []) for i in range(s.config.n))))
        await asyncio.gather(*(s.evaluate(a) for a in attempts))
    else:
        for i in range(s.config.n):
            record = await s.attempt(i, list(attempts))
            await s.evaluate(record)
            attempts.append(record)
    memory, summary, prompt_tokens, reason = await s.summarize(attempts)
    return attempts, memory, summary, prompt_tokens, reason
