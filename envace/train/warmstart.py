"""Supervised warm start for the tiny smoke model (ours; smoke scale only, never at paper scale).

Why: an untrained tiny model answers every prompt with whitespace. No tool call of it parses, every
reward is zero, and a tau^2 user simulator served from it never states a request, so most code paths
would go unexercised at smoke scale. A few SFT steps on the CM2 fixture records fix that.

Implemented:
- :func:`sft_sequences` — ``(token ids, prompt length)`` pairs from CM2 training examples, four
  behaviours:
  - *acting* (tools listed in the system turn): the example's initial prompt -> its reference first-turn
    tool calls as hermes ``<tool_call>`` blocks;
  - *rehearsing*: the REHEARSE chat of each reference first-turn call, built by the rollout's own
    :class:`envace.core.rehearsal.RehearsalContext` with the training prompt (``rehearsal_v2``) -> the call's
    reference response in an ``<execution_result>`` block (later calls continue the same chat, as in a
    rollout). The same prompt reaches the standard-GRPO baseline's simulator, so both runs' episodes go
    on past the first call;
  - *answering*: the prompt, the reference calls and their reference responses as tool messages -> a
    final answer that quotes the first response (ours: the normalised example keeps no reference answer
    text; any text without a call ends the turn);
  - *simulated user* (no tools): a user-simulator chat (:data:`USER_SYSTEM` + the agent's greeting) ->
    the example's first user request as plain text;
  - *memory* (only where a stage asks for it): the acting rows again with a TTS rehearsal memory appended
    to the system turn, as the TTS commit's prompt (:func:`envace.core.tts.fallback_memory_suffixes`: the
    memory a rehearser that writes no usable review or summary leaves, after one and after two attempts).
  A stage may build a share of its REHEARSE rows without the reference responses (``hidden_references``:
  the prompt of test-time rehearsal, fidelity and TTS), in another rehearsal prompt (``rehearsal_prompt``),
  and mix in rows of other records (``mix``; see :class:`Stage`).
  Each prompt is rendered both without template arguments (what ``vllm serve`` completions and our
  evaluation use) and with ``enable_thinking=False`` (Qwen3's empty think block, the training runs'
  ``apply_chat_template_kwargs``).
- :func:`sft` — cross-entropy steps on the response tokens (summed over all responses, divided by their
  count), AdamW, gradient clipping, length-sorted micro-batches; returns the loss per step.
  (The smoke runs then train the warm-started model with verl's main_ppo.)

Why all four: with acting alone every rollout's first REHEARSE reply (or simulator reply) was malformed,
the episode ended there and every verl smoke run scored 0 in every batch (docs/measurements.md).
Simplification: later user turns are not trained on; the model only needs to emit parseable protocol
text, not good answers. Limit: the fixture prompts are short (about 200-400
tokens), and the 2-layer model does not carry the behaviour to the 8-9k-token prompts of tau^2 and BFCL
(tau^2's policy, BFCL's tool docs): there it still emits no parseable call. It does on the CM2
training prompts (so smoke rewards are non-zero); on FinMCP's short prompts it opens ``<tool_call>`` but
the JSON comes out malformed (the parse-error path); as tau^2's simulated user it answers with non-empty
text, which is what the conversation needs to proceed. Training on long prompts costs minutes of CPU.

Curriculum (``Stage.omit_tool_list``, ours): the same acting and answering rows rendered without the
system turn's tool list are ~4x shorter (ledger: ~100 tokens instead of ~390). On them the tiny model
learns to copy an account name or amount from the request into the call within ~1000 steps of ~0.06 s
(2 cores), where on full rows the same behaviour appears only after ~1200-2000 steps of ~0.24 s; a
following stage on full rows carries it over in ~50 steps (loss 0.002 on full rows; measured on the
ledger: docs/measurements.md, "The curriculum warm start").
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import torch

from envace.core.rehearsal import (
    RESULT_CLOSE,
    RESULT_OPEN,
    CallCandidate,
    RehearsalContext,
    RehearsalPrompt,
    ToolRegistry,
)
from envace.core.tools import ToolCall, assistant_message, render_tool_call, tool_message
from envace.core.tts import fallback_memory_suffixes
from envace.train.data import TrainingExample

__all__ = ["USER_SYSTEM", "GREETING", "BEHAVIOURS", "DEFAULT_BEHAVIOURS", "RENDERINGS", "hides_references",
           "Stage", "sft_sequences", "sft"]

#: System turn of the simulated-user examples (our wording).
USER_SYSTEM = "You play a customer talking to an assistant. State your request in one message."
#: The agent's opening line the simulated user answers (our wording).
GREETING = "Hi! How can I help you today?"

#: The chat-template renderings a prompt can be trained in: ``plain`` (the template's defaults, as
#: ``vllm serve`` completions and our evaluation render it) and ``no_thinking`` (``enable_thinking=False``,
#: Qwen3's empty think block: the training runs' ``apply_chat_template_kwargs``).
RENDERINGS: dict[str, dict[str, Any]] = {"plain": {}, "no_thinking": {"enable_thinking": False}}
_TEMPLATE_VARIANTS: tuple[dict[str, Any], ...] = tuple(RENDERINGS.values())


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: dict[str, Any]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=True, **template_kwargs)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _first_user_text(example: TrainingExample) -> str | None:
    for message in example.prompt:
        if message["role"] == "user" and str(message["content"]).strip():
            return str(message["content"])
    return None


def _response_text(response: Any) -> str:
    """A reference response as the observation text a tool message carries (JSON unless a string)."""
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


def _rehearsal_rows(ex: TrainingExample, calls: list[ToolCall], caller_text: str, responses: list[str],
                    tokenizer: Any, prompt: RehearsalPrompt, template_kwargs: dict[str, Any],
                    show_references: bool = True) -> list[tuple[list[int], int]]:
    """One row per reference call: its REHEARSE context (as the rollout builds it; ``caller_text`` the
    ACT turn that made the calls; the example's reference responses listed in it if ``show_references``,
    none otherwise, as test-time rehearsal builds it) -> the reference response in an
    ``<execution_result>`` block; each reply is recorded so later calls see it."""
    shown = list(ex.references) if show_references else []
    context = RehearsalContext(tokenizer, prompt, ToolRegistry(ex.tools), list(ex.prompt), shown,
                               dict(template_kwargs))
    rows = []
    for call, response in zip(calls, responses, strict=False):
        ids = list(context.prompt_ids(CallCandidate(call, caller_text)))
        target = list(tokenizer.encode(f"{RESULT_OPEN}{response}{RESULT_CLOSE}", add_special_tokens=False))
        target.append(tokenizer.eos_token_id)
        rows.append((ids + target, len(ids)))
        context.record_response(target)
    return rows


BEHAVIOURS: tuple[str, ...] = ("act", "answer", "user", "rehearse", "memory")
#: The behaviours a stage builds when it names none (``memory`` only where asked for: it is for the TTS
#: commit, and the stages written before it existed keep their rows).
DEFAULT_BEHAVIOURS: tuple[str, ...] = ("act", "answer", "user", "rehearse")


def _with_system_suffix(messages: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """``messages`` with ``suffix`` appended to the system turn (one created when there is none), as the
    TTS commit builds its prompt."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": str(messages[0]["content"]) + suffix}, *messages[1:]]
    return [{"role": "system", "content": suffix.lstrip("\n")}, *messages]


def hides_references(uid: str, fraction: float) -> bool:
    """Whether example ``uid``'s REHEARSE rows are built without reference responses, for a stage that
    hides them in ``fraction`` of the examples: a fixed function of the uid (CRC-32, not Python's salted
    ``hash``), so the same examples are chosen on every machine and in every run."""
    return zlib.crc32(uid.encode()) % 10_000 < round(fraction * 10_000)


def sft_sequences(examples: Sequence[TrainingExample], tokenizer: Any,
                  rehearsal_prompt: str = "rehearsal_v2", behaviours: Sequence[str] = DEFAULT_BEHAVIOURS,
                  template_variants: Sequence[dict[str, Any]] = _TEMPLATE_VARIANTS, tool_list: bool = True,
                  hidden_references: float = 0.0) -> list[tuple[list[int], int]]:
    """SFT rows ``(prompt ids + response ids + [eos], len(prompt ids))`` (see the module docstring), of
    the given ``behaviours`` (a subset of :data:`BEHAVIOURS`), each prompt rendered with each of
    ``template_variants`` (chat-template keyword arguments). ``tool_list=False`` renders the acting and
    answering prompts without the system turn's tool list (a curriculum: see the module docstring);
    REHEARSE rows always show the tools, as the rollout does. ``hidden_references``: the fraction of
    examples whose REHEARSE rows show no reference responses (:func:`hides_references`), the prompt of
    test-time rehearsal (fidelity, TTS); the others show them, as the RL rollout's prompt does."""
    if not 0.0 <= hidden_references <= 1.0:
        raise ValueError(f"hidden_references must be in [0, 1], got {hidden_references}")
    unknown = set(behaviours) - set(BEHAVIOURS)
    if unknown:
        raise ValueError(f"unknown warm-start behaviours {sorted(unknown)}; known: {list(BEHAVIOURS)}")
    eos = tokenizer.eos_token_id
    prompt = RehearsalPrompt(rehearsal_prompt)
    rows: list[tuple[list[int], int]] = []
    for ex in examples:
        targets: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]] = []
        calls = [ToolCall(c["name"], c["arguments"]) for c in ex.reference_calls]
        responses = [_response_text(r["response"]) for r in ex.references[: len(calls)]]
        act_text = "\n".join(render_tool_call(c) for c in calls)
        listed = ex.tools if tool_list else None
        if calls and "act" in behaviours:
            targets.append((ex.prompt, listed, act_text))
        answer_text = f"The result: {responses[0]}" if responses else ""
        if calls and len(responses) == len(calls) and "answer" in behaviours:
            answered = [*ex.prompt, assistant_message("", calls),
                        *(tool_message(r, c.name) for c, r in zip(calls, responses, strict=True))]
            targets.append((answered, listed, answer_text))
        if calls and len(responses) == len(calls) and "memory" in behaviours:
            for suffix in fallback_memory_suffixes([answer_text, answer_text]):
                targets.append((_with_system_suffix(list(ex.prompt), suffix), listed, act_text))
        request = _first_user_text(ex)
        if request is not None and "user" in behaviours:
            chat = [{"role": "system", "content": USER_SYSTEM}, {"role": "user", "content": GREETING}]
            targets.append((chat, None, request))
        for messages, tools, text in targets:
            target = list(tokenizer.encode(text, add_special_tokens=False)) + [eos]
            for kwargs in template_variants:
                ids = _prompt_ids(tokenizer, messages, tools, kwargs)
                rows.append((ids + target, len(ids)))
        for kwargs in template_variants if "rehearse" in behaviours else ():
            rows.extend(_rehearsal_rows(ex, calls, act_text, responses, tokenizer, prompt, kwargs,
                                        show_references=not hides_references(ex.uid, hidden_references)))
    return rows


def _response_nll(model: torch.nn.Module, rows: list[tuple[list[int], int]], pad_id: int) -> torch.Tensor:
    """Summed negative log-likelihood of the response tokens of ``rows`` (a scalar).

    The LM head runs only on the positions that predict a response token (``N`` of them): the
    decoder's last hidden states ``(B, L, H)`` are gathered to ``(N, H)``, then projected to ``(N, V)``.
    The same loss as projecting every position, at a fraction of the cost when prompts are long (a
    REHEARSE row is ~500 prompt tokens for ~30 response tokens; the vocabulary projection and its
    softmax dominated a step).
    """
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), length), dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for b, (seq, prompt_len) in enumerate(rows):
        ids[b, : len(seq)] = torch.tensor(seq)
        attn[b, : len(seq)] = 1
        labels[b, prompt_len: len(seq)] = torch.tensor(seq[prompt_len:])
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, L, H)
    target = labels[:, 1:]  # (B, L-1): position t predicts token t+1
    keep = target != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()  # (N, V)
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")


@dataclass(frozen=True)
class Stage:
    """One warm-start stage (config ``tiny_model.warmstart[i]``): ``steps`` SFT steps at ``lr`` on the
    rows of ``behaviours`` x ``renderings`` built from the CM2-layout records of ``data`` (one or more
    files, concatenated), ``batch_rows`` rows per step (``None``: every row every step), with the tool
    list left out of acting and answering prompts if ``omit_tool_list``, and the reference responses left
    out of the REHEARSE prompts of ``hidden_references`` of the examples. ``mix``: more row sets drawn
    into the same batches, each with its own records and row settings (a mix item is a stage without
    steps, lr and batch size: e.g. REHEARSE-only rows of other records, which trained alone would make
    the model forget how to act). Stages run in order on the same model, each with a fresh AdamW (ours;
    smoke scale only)."""

    data: tuple[str, ...]
    steps: int
    lr: float
    batch_rows: int | None = None
    behaviours: tuple[str, ...] = DEFAULT_BEHAVIOURS
    renderings: tuple[str, ...] = tuple(RENDERINGS)
    omit_tool_list: bool = False
    hidden_references: float = 0.0
    rehearsal_prompt: str = "rehearsal_v2"
    mix: tuple[Stage, ...] = ()

    @classmethod
    def parse(cls, spec: Any, where: str) -> Stage:
        """A stage from its config mapping, checked against the config schema's
        ``tiny_model.warmstart`` item (one source of the rules, also for ``envace tiny-model --warmstart``);
        a ``ValueError`` names the offending key (``where.key``)."""
        from envace.common.config import schema

        item = schema()["properties"]["tiny_model"]["properties"]["warmstart"]["items"]
        errors = list(jsonschema.Draft202012Validator(item).iter_errors(spec))
        if errors:
            err = jsonschema.exceptions.best_match(errors)
            key = ".".join(str(p) for p in err.absolute_path)
            raise ValueError(f"{where}{'.' + key if key else ''}: {err.message}")
        return cls._from(spec, spec["steps"], float(spec["lr"]), spec.get("batch_rows"))

    @classmethod
    def _from(cls, spec: Any, steps: int, lr: float, batch_rows: int | None) -> Stage:
        data = (spec["data"],) if isinstance(spec["data"], str) else tuple(spec["data"])
        mix = tuple(cls._from(part, steps, lr, batch_rows) for part in spec.get("mix", ()))
        return cls(data, steps, lr, batch_rows,
                   tuple(spec.get("behaviours", DEFAULT_BEHAVIOURS)),
                   tuple(spec.get("renderings", RENDERINGS)),
                   bool(spec.get("omit_tool_list", False)), float(spec.get("hidden_references", 0.0)),
                   str(spec.get("rehearsal_prompt", "rehearsal_v2")), mix)

    def as_dict(self) -> dict[str, Any]:
        """The stage as its config mapping; ``hidden_references`` and ``rehearsal_prompt`` only when not
        the default, so that a stage without them keeps the spec (and hash) it had before they existed."""
        out = {"data": list(self.data), "steps": self.steps, "lr": self.lr, "batch_rows": self.batch_rows,
               "behaviours": list(self.behaviours), "renderings": list(self.renderings),
               "omit_tool_list": self.omit_tool_list}
        if self.hidden_references:
            out["hidden_references"] = self.hidden_references
        if self.rehearsal_prompt != "rehearsal_v2":
            out["rehearsal_prompt"] = self.rehearsal_prompt
        if self.mix:
            keep = ("data", "behaviours", "renderings", "omit_tool_list", "hidden_references",
                    "rehearsal_prompt")
            out["mix"] = [{k: v for k, v in part.as_dict().items() if k in keep} for part in self.mix]
        return out

    def parts(self) -> tuple[Stage, ...]:
        """This stage's row sets: its own, then each ``mix`` item's (same steps, lr and batch size)."""
        return (self, *self.mix)

    def rows(self, examples: Sequence[TrainingExample], tokenizer: Any) -> list[tuple[list[int], int]]:
        """This stage's SFT rows of ``examples`` (:func:`sft_sequences`)."""
        return sft_sequences(examples, tokenizer, rehearsal_prompt=self.rehearsal_prompt,
                             behaviours=self.behaviours,
                             template_variants=tuple(RENDERINGS[r] for r in self.renderings),
                             tool_list=not self.omit_tool_list, hidden_references=self.hidden_references)


def sft(model: torch.nn.Module, rows: list[tuple[list[int], int]], steps: int, lr: float, pad_id: int,
        micro_batch_rows: int = 8, grad_clip: float = 1.0, batch_rows: int | None = None,
        seed: int = 0, after_step: Callable[[int, float], None] | None = None) -> list[float]:
    """``steps`` SFT steps on ``rows``; returns the mean token loss of each step.

    ``batch_rows=None``: every step uses all rows (full batch). ``batch_rows=B``: every step uses ``B``
    rows drawn without replacement by a ``random.Random(seed)`` (mini-batch SGD: many more updates per
    CPU second when ``rows`` is large). ``after_step(step, loss)`` is called after each step (1-based),
    with ``model`` in eval mode (put back in train mode after). Leaves ``model`` in eval mode. An empty
    ``rows`` or ``steps == 0`` trains nothing.
    """
    if not rows or steps <= 0:
        return []
    rng = random.Random(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        batch = rows if batch_rows is None or batch_rows >= len(rows) else rng.sample(rows, batch_rows)
        batch = sorted(batch, key=lambda r: len(r[0]))
        n_tokens = sum(len(seq) - p for seq, p in batch)
        total = 0.0
        for i in range(0, len(batch), micro_batch_rows):
            part = _response_nll(model, batch[i: i + micro_batch_rows], pad_id) / n_tokens
            part.backward()
            total += float(part.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(total)
        if after_step is not None:
            model.eval()
            after_step(len(losses), total)
            model.train()
    model.eval()
    return losses
