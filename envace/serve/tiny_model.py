"""A tiny Qwen3-architecture model with a Qwen3-style tokenizer, built in-process, for CPU tests/smoke.

Implemented:
- :func:`build_tiny_tokenizer` — a byte-level BPE (``tokenizers``) trained on a small built-in corpus,
  with the chat markers of Qwen3 as special tokens and its tool/think tags as single non-special added
  tokens (as Qwen3 marks them), wrapped as a ``PreTrainedTokenizerFast`` with a
  Qwen3-style Jinja chat template written for this project: system/user/assistant/tool roles, tools
  listed in the system turn, assistant ``tool_calls`` as hermes ``<tool_call>`` blocks, consecutive tool
  messages grouped into one user turn as ``<tool_response>`` blocks, ``<think>`` handling as in Qwen3
  (reasoning kept only after the last user query; the last assistant turn gets an empty think block),
  ``add_generation_prompt`` and ``enable_thinking=False`` (an empty think block after the prompt).
- :func:`tiny_model_and_tokenizer` — that tokenizer and a seeded ``Qwen3ForCausalLM`` (2 layers, hidden
  64, vocab 2048, 4 heads of dim 32 — vLLM's CPU
  attention needs head_dim >= 32 —, tied embeddings, about 0.23 M parameters), in memory.
- :func:`build_tiny_model` — the same saved to a directory loadable with ``AutoModelForCausalLM`` /
  ``AutoTokenizer``.
- :class:`HFGenerateBackend` — the rollout loop's generate backend over any HF causal LM: ancestral
  sampling with a seeded ``torch.Generator`` (temperature, top-p, greedy at temperature 0), KV cache,
  stop at eos or ``max_tokens``; returns token ids and their log-probs under the sampling distribution
  (logits divided by the temperature, before top-p truncation; verl's trainer scales logits the same
  way; greedy decoding reports temperature-1 log-probs). One sequence at a time (no batching): enough
  for tests and smoke runs.

The model is untrained: its outputs are random byte sequences, useful only for exercising code paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from envace.core.prompts import load_prompt

__all__ = [
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "build_tiny_tokenizer",
    "tiny_model_and_tokenizer",
    "build_tiny_model",
    "HFGenerateBackend",
]

VOCAB_SIZE = 2048
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
#: Single added tokens that are not "special" (kept by ``decode(skip_special_tokens=True)``), as in Qwen3.
PROTOCOL_TOKENS = SPECIAL_TOKENS[3:]

CHAT_TEMPLATE = r"""
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- set first_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system
{% if first_system %}{{ messages[0].content }}

{% endif %}# Tools

Functions you can call, one JSON schema per line:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>

To call a function, write a JSON object with its name and arguments inside tags:
<tool_call>
{"name": <function-name>, "arguments": <arguments-object>}
</tool_call><|im_end|>
{% elif first_system -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'user' or m.role == 'system' -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' -%}
{%- set content = m.content or '' -%}
{%- set reasoning = m.reasoning_content or '' -%}
{%- if not reasoning and '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
<|im_start|>assistant
{% if loop.index0 > ns.last_user and (loop.last or reasoning) -%}
<think>
{{ reasoning }}
</think>

{% endif -%}
{{ content }}
{%- for tc in m.tool_calls or [] -%}
{%- set f = tc.function if tc.function is defined else tc -%}
{%- if content or not loop.first -%}{{ '\n' }}{%- endif -%}
<tool_call>
{"name": {{ f.name | tojson }}, "arguments": {% if f.arguments is string %}{{ f.arguments }}\
{% else %}{{ f.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor -%}
<|im_end|>
{% elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
<|im_start|>user
{%- endif %}

<tool_response>
{{ m.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
<|im_end|>
{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking -%}
<think>

</think>

{% endif -%}
{%- endif -%}
""".strip().replace("\\\n", "")

_CORPUS = [
    "You are a helpful assistant. Use the tools when they help answer the user's question.",
    'The user asked about the weather in Paris. {"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"error": "INVALID_PARAMETERS", "message": "missing required field"}',
    '{"error": "TOOL_NOT_AVAILABLE", "message": "no such tool"}',
    '{"error": "INVALID_TOOL_CALL_FORMAT", "message": "could not parse"}',
    "<execution_result>{\"temperature\": 21, \"unit\": \"celsius\"}</execution_result>",
    "Check the call format, the tool name, and the arguments against the JSON schema.",
    '{"type": "function", "function": {"name": "search", "description": "Search the web", '
    '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}',
    "Book a flight from Berlin to Tokyo on 2025-05-01 for two passengers and reserve a hotel room.",
    "The order 12345 was cancelled; the refund of 42.50 USD will arrive within 5 business days.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
    "# Tools\n# Caller output\n# Call to execute\n# Conversation so far\n[user]\n[assistant]\n[tool]\n",
]
#: The ledger benchmark's vocabulary (envace/bench/ledger.py: its account pool, tool names and phrasing), so
#: that an account name is one token, the same in a question and in a call's JSON (both quote it): a
#: name split into pieces that differ between the two (' a|li|ce' vs '"al|i|ce') kept the 2-layer model
#: from learning to copy it. tests/serve/test_tiny_model.py checks it against the benchmark.
_LEDGER_CORPUS = [
    "alice bob carol dave erin frank grace heidi ivan judy mallory oscar",
    '"alice" "bob" "carol" "dave" "erin" "frank" "grace" "heidi" "ivan" "judy" "mallory" "oscar"',
    "You manage a small ledger through its tools. Use them, then answer the user briefly.",
    'What is the balance of "alice"? Transfer 17 from "bob" to "carol",',
    'then tell me the new balance of "carol".',
    '{"name": "get_balance", "arguments": {"account": "alice"}} {"name": "list_accounts", "arguments": {}}',
    '{"name": "transfer", "arguments": {"source": "bob", "target": "carol", "amount": 17}}',
    '{"account":"alice","balance":57} {"ok":true,"source_balance":30,"target_balance":30} The result: ',
]


def _corpus() -> list[str]:
    """The built-in training corpus: the sentences above, the rehearsal prompt's text (so rehearsal
    contexts tokenize compactly), the ledger benchmark's vocabulary, numbers and JSON-ish fragments."""
    prompt = load_prompt("rehearsal_v1")
    prompt_text = [v for v in prompt.values() if isinstance(v, str)]
    numbers = [" ".join(str(i) for i in range(k, k + 50)) for k in range(0, 3000, 50)]
    fields = [f'{{"id": {i}, "name": "item_{i}", "price": {i * 1.5}, "ok": true}}' for i in range(200)]
    return (_CORPUS + prompt_text) * 4 + _LEDGER_CORPUS * 3 + numbers + fields


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer (vocab 2048) and wrap it with the chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # As in Qwen3, only the chat markers are *special*; the protocol tags are plain added tokens, so a
    # server that decodes with skip_special_tokens (vllm serve) keeps <tool_call> in its text.
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] not in PROTOCOL_TOKENS
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS[1:] if t not in PROTOCOL_TOKENS],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )


def tiny_model_and_tokenizer(seed: int = 0) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """The tiny ``Qwen3ForCausalLM`` (weights seeded by ``seed``, eval mode) and its tokenizer."""
    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention refuses head_dim < 32 (v1/attention/backends/cpu_attn.py)
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.eval()
    return model, tokenizer


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Save the tiny model and tokenizer to ``out_dir`` (created if needed); returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = tiny_model_and_tokenizer(seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class HFGenerateBackend:
    """Generate backend (see ``envace.core.rollout.GenerateBackend``) over a local HF causal LM.

    Args:
        model: a causal LM (``model(input_ids, past_key_values=..., use_cache=True)``).
        eos_token_ids: generation stops after any of these ids (the stop id is returned).
        seed: seed of the backend's ``torch.Generator``; the sequence of calls is reproducible.
    """

    def __init__(self, model: Any, eos_token_ids: list[int], seed: int = 0) -> None:
        self.model = model
        self.eos_token_ids = set(eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float]]:
        max_tokens = int(params.get("max_tokens", 64))
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        out_ids: list[int] = []
        logprobs: list[float] = []
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        past = None
        for _ in range(max_tokens):
            out = self.model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            if temperature <= 0:
                token = int(torch.argmax(logits))
                logprob = float(torch.log_softmax(logits, -1)[token])
            else:
                logp = torch.log_softmax(logits / temperature, -1)
                probs = logp.exp()
                if top_p < 1.0:
                    sorted_p, order = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
                    probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
                token = int(torch.multinomial(probs, 1, generator=self.generator))
                logprob = float(logp[token])
            out_ids.append(token)
            logprobs.append(logprob)
            if token in self.eos_token_ids:
                break
            input_ids = torch.tensor([[token]], dtype=torch.long)
        return out_ids, logprobs

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """Sample a continuation of ``prompt_ids``; returns ``(token_ids, logprobs)``, both length ``T``.

        ``sampling_params``: ``max_tokens`` (default 64), ``temperature`` (default 1.0), ``top_p``
        (default 1.0). Runs synchronously inside the coroutine (CPU, tiny model).
        """
        return self._sample(prompt_ids, sampling_params)
