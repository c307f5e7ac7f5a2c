"""Harness overhead of the ACT/REHEARSE rollout loop (``envace.core.rollout``) with a zero-cost backend.

A scripted backend returns pre-encoded token ids instantly (one tool call for ACT, one
``<execution_result>`` for REHEARSE), so the time measured is the harness alone: parsing, validation,
chat-template deltas, token bookkeeping. Each trajectory runs ``--turns`` ACT turns (ending at
max_turns) with the tiny Qwen3-style tokenizer of ``envace.serve.tiny_model``, under the episode rules of
:data:`RULES` (every ACT turn counts toward max_turns, one budget for the episode, the chat template's
default rendering as verl's ``apply_chat_template_kwargs: {}`` below), not ``RolloutConfig``'s defaults.

Reported per turn (one ACT generation + one REHEARSE reply): harness time (backend time excluded), and
tokens encoded for each context, early turns vs late turns. Because contexts only grow and only new
parts are encoded, encoded tokens per turn stay flat while the contexts grow; the "re-encode" column
shows what re-tokenizing the whole prompt each turn would cost instead.

Side by side (ACT context only, no rehearsal): our loop in ``real`` mode with a zero-cost environment,
and verl 0.9.1's ``ToolAgentLoop`` (``tool_agent``, hermes parser, continuous-token builder for
``qwen3``) driven by the same scripted replies through a stand-in ``server_manager`` and a zero-cost
async ``FunctionTool``. verl stops after its 30th assistant turn without calling the tool, so it makes
one tool call fewer; times are per ACT turn. verl is imported only for that part (``--no-verl`` skips it).

Usage: ``python benchmarks/bench_rollout.py [--trajectories 1000] [--turns 30] [--no-verl]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from envace.core.rollout import Mode, RolloutConfig, Termination, run_rollout
from envace.core.tools import ToolCall, render_tool_call
from envace.serve.tiny_model import build_tiny_tokenizer

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
RESULT_JSON = '{"temp": 4, "sky": "cloudy"}'
TASK = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Oslo, Bergen and Tromso this week?"}]
#: The episode rules both loops of ours run under (stated: RolloutConfig's defaults are the training run's).
RULES: dict[str, Any] = {"context_budget": "episode", "turn_cap": "every_turn", "template_kwargs": {}}


class ZeroCostBackend:
    """Alternates a pre-encoded tool call (ACT) and a pre-encoded result (REHEARSE); records prompt lengths
    and the time spent inside ``generate``."""

    def __init__(self, act_ids: list[int], rehearse_ids: list[int]) -> None:
        self.replies = [act_ids, rehearse_ids]
        self.calls = 0
        self.prompt_lens: list[int] = []
        self.inside = 0.0

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        start = time.perf_counter()
        ids = self.replies[self.calls % 2]
        self.calls += 1
        self.prompt_lens.append(len(prompt_ids))
        out = list(ids), [0.0] * len(ids)
        self.inside += time.perf_counter() - start
        return out


class ZeroCostEnv:
    """Real-mode environment answering every call instantly with the same JSON."""

    def step(self, call: ToolCall) -> str:
        return RESULT_JSON


def per_turn_encoded(prompt_lens: list[int], response_len: int) -> list[int]:
    """Tokens encoded before each generation after the first: prompt growth minus the model's tokens."""
    return [b - a - response_len for a, b in zip(prompt_lens, prompt_lens[1:], strict=False)]


async def bench(n_traj: int, turns: int) -> dict[str, Any]:
    tok = build_tiny_tokenizer()
    eos = tok.eos_token_id
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    act_ids = tok.encode(call, add_special_tokens=False) + [eos]
    reply = f"<execution_result>{RESULT_JSON}</execution_result>"
    reh_ids = tok.encode(reply, add_special_tokens=False) + [eos]
    config = RolloutConfig(max_turns=turns, max_response_tokens=10**7, max_rehearse_context_tokens=10**7,
                           **RULES)
    wall = inside = 0.0
    act_enc: list[list[int]] = []
    reh_enc: list[list[int]] = []
    act_len: list[list[int]] = []
    reh_len: list[list[int]] = []
    for _ in range(n_traj):
        backend = ZeroCostBackend(act_ids, reh_ids)
        start = time.perf_counter()
        traj = await run_rollout(backend, tok, TASK, TOOLS, config)
        wall += time.perf_counter() - start
        inside += backend.inside
        assert traj.termination == Termination.MAX_TURNS and traj.num_turns == turns
        act_lens, reh_lens = backend.prompt_lens[0::2], backend.prompt_lens[1::2]
        # Every token that is not a model token was encoded exactly once, model tokens never.
        assert traj.encoded_tokens["act"] == len(traj.act_ids) - turns * len(act_ids)
        assert traj.encoded_tokens["rehearse"] == reh_lens[-1] + len(reh_ids) - turns * len(reh_ids)
        act_enc.append(per_turn_encoded(act_lens, len(act_ids)))
        reh_enc.append(per_turn_encoded(reh_lens, len(reh_ids)))
        act_len.append(act_lens)
        reh_len.append(reh_lens)
    n_turns = n_traj * turns
    k = min(5, turns - 1)

    def mean(rows: list[list[int]], sl: slice) -> float:
        return statistics.fmean(x for row in rows for x in row[sl])

    return {
        "trajectories": n_traj,
        "turns": turns,
        "overhead_ms_per_turn": 1e3 * (wall - inside) / n_turns,
        "backend_ms_per_turn": 1e3 * inside / n_turns,
        "act_encoded_early": mean(act_enc, slice(0, k)),
        "act_encoded_late": mean(act_enc, slice(-k, None)),
        "reh_encoded_early": mean(reh_enc, slice(0, k)),
        "reh_encoded_late": mean(reh_enc, slice(-k, None)),
        "act_context_early": mean(act_len, slice(1, k + 1)),
        "act_context_late": mean(act_len, slice(-k, None)),
        "reh_context_early": mean(reh_len, slice(1, k + 1)),
        "reh_context_late": mean(reh_len, slice(-k, None)),
        "k": k,
    }


async def bench_act_only(n_traj: int, turns: int) -> tuple[float, float, list[int]]:
    """Our loop, ``real`` mode, zero-cost environment: (harness ms per ACT turn, prompt growth per turn,
    the last trajectory's ACT context ids)."""
    tok = build_tiny_tokenizer()
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    act_ids = tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    config = RolloutConfig(mode=Mode.REAL, max_turns=turns, max_response_tokens=10**7, **RULES)
    wall = inside = 0.0
    growth: list[int] = []
    for _ in range(n_traj):
        backend = ZeroCostBackend(act_ids, act_ids)
        start = time.perf_counter()
        traj = await run_rollout(backend, tok, TASK, TOOLS, config, environment=ZeroCostEnv())
        wall += time.perf_counter() - start
        inside += backend.inside
        assert traj.num_turns == turns
        growth.extend(b - a for a, b in zip(backend.prompt_lens, backend.prompt_lens[1:], strict=False))
    return 1e3 * (wall - inside) / (n_traj * turns), statistics.fmean(growth), traj.act_ids


async def bench_verl(n_traj: int, turns: int) -> tuple[float, float, list[int]]:
    """verl 0.9.1 ToolAgentLoop on the same replies: (harness ms per ACT turn, prompt growth per turn, the
    last trajectory's prompt + response ids)."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.workers.rollout.replica import TokenOutput

    tok = build_tiny_tokenizer()
    call = render_tool_call(ToolCall("get_weather", {"city": "Oslo"}))
    act_ids = tok.encode(call, add_special_tokens=False) + [tok.eos_token_id]
    big = 10**7
    multi_turn = {"max_user_turns": turns, "max_assistant_turns": turns, "max_parallel_calls": 1,
                  "max_tool_response_length": big, "tool_response_truncate_side": "middle",
                  "format": "hermes"}
    rollout = {"prompt_length": big, "response_length": big, "full_determinism": False,
               "multi_turn": multi_turn}
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}})
    data_cfg = OmegaConf.create({"apply_chat_template_kwargs": {}})

    async def get_weather(city: str) -> str:
        return RESULT_JSON

    tool = FunctionTool(name="get_weather", fn=get_weather, is_async=True,
                        tool_schema=OpenAIFunctionToolSchema.model_validate(TOOLS[0]))

    class ServerManager:
        def __init__(self) -> None:
            self.inside = 0.0
            self.prompt_lens: list[int] = []

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           **kwargs: Any) -> Any:
            start = time.perf_counter()
            self.prompt_lens.append(len(prompt_ids))
            out = TokenOutput(token_ids=list(act_ids), log_probs=[0.0] * len(act_ids))
            self.inside += time.perf_counter() - start
            return out

    wall = inside = 0.0
    growth: list[int] = []
    for _ in range(n_traj):
        sm = ServerManager()
        loop = ToolAgentLoop(DictConfigWrap(cfg), sm, tok, None, None, DictConfigWrap(data_cfg),
                             hf_model_type="qwen3", tools=ToolListWrap([tool]))
        start = time.perf_counter()
        out = await loop.run({"temperature": 1.0}, raw_prompt=[dict(m) for m in TASK])
        wall += time.perf_counter() - start
        inside += sm.inside
        assert len(sm.prompt_lens) == turns and len(out.response_ids) > 0
        growth.extend(b - a for a, b in zip(sm.prompt_lens, sm.prompt_lens[1:], strict=False))
    ids = list(out.prompt_ids) + list(out.response_ids)
    return 1e3 * (wall - inside) / (n_traj * turns), statistics.fmean(growth), ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=30, help="ACT turns per trajectory (>= 2: the early and "
                        "late windows compare different turns)")
    parser.add_argument("--no-verl", action="store_true", help="skip the verl ToolAgentLoop comparison")
    args = parser.parse_args(argv)
    if args.turns < 2 or args.trajectories < 1:
        parser.error(f"--turns must be >= 2 and --trajectories >= 1, got {args.turns} and "
                     f"{args.trajectories}")
    r = asyncio.run(bench(args.trajectories, args.turns))
    k = r["k"]
    print(f"envace rollout loop: {r['trajectories']} trajectories x {r['turns']} turns, zero-cost backend")
    print(f"harness overhead per turn (ACT + REHEARSE, generation excluded): "
          f"{r['overhead_ms_per_turn']:.3f} ms  (inside backend: {r['backend_ms_per_turn']:.4f} ms)")
    print()
    print("tokens encoded per turn (only new tokens) vs the context size a full re-encode would process:")
    print(f"{'context':<10}{'turns':<12}{'encoded/turn':>14}{'context size':>16}")
    for name, key in (("ACT", "act"), ("REHEARSE", "reh")):
        early = f"{r[key + '_encoded_early']:>14.1f}{r[key + '_context_early']:>16.1f}"
        late = f"{r[key + '_encoded_late']:>14.1f}{r[key + '_context_late']:>16.1f}"
        print(f"{name:<10}{f'2..{k + 1}':<12}{early}")
        print(f"{'':<10}{f'last {k}':<12}{late}")
    print()
    print("ACT context only (real mode, zero-cost tool), harness ms per ACT turn:")
    ours_ms, ours_growth, ours_ids = asyncio.run(bench_act_only(args.trajectories, args.turns))
    print(f"  envace run_rollout(mode=real)   {ours_ms:8.3f} ms   prompt growth/turn {ours_growth:.1f}")
    if not args.no_verl:
        verl_ms, verl_growth, verl_ids = asyncio.run(bench_verl(args.trajectories, args.turns))
        print(f"  verl 0.9.1 ToolAgentLoop        {verl_ms:8.3f} ms   prompt growth/turn {verl_growth:.1f}")
        same = ours_ids[: len(verl_ids)] == verl_ids
        print(f"  same ACT token ids ({len(verl_ids)} tokens, verl's context a prefix of ours): {same}")


if __name__ == "__main__":
    main()
