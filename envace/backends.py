"""Model backends for evaluation (the rollout loop's token-level ``generate(prompt_ids, params)``).

Implemented:
- :class:`VLLMCompletionsBackend` — an OpenAI-compatible ``/v1/completions`` server that accepts token-id
  prompts (vLLM): sends ``prompt`` = the ids, asks for ``return_tokens_as_token_ids`` and
  ``logprobs=1``, and returns the sampled ids (read from ``token_id:N`` strings) and their log-probs, so
  the tokens are exactly the model's. ``skip_special_tokens=false`` keeps the turn end.
- :class:`TextCompletionsBackend` — for ``transformers serve`` (CPU), whose ``/v1/completions`` takes only
  a text prompt and returns text without token ids or log-probs. Route chosen: decode the prompt ids
  (with special tokens) to text, send it, re-tokenize the reply and append the turn-end token when the
  server stopped for a reason other than the length limit. Trade-off: the reply's ids are a
  re-tokenization (may differ from the sampled ids where BPE is ambiguous), special tokens the server
  strips are lost, and log-probs are reported as 0 — fine for evaluation (scores only read text), not for
  training. Chat completions were not chosen: they would re-render the whole chat server-side each turn
  and could not continue our exact ACT context.
- Both detect a dead server: a connection error, timeout or non-200 reply raises
  :class:`envace.bench.runner.BackendError` naming the server (and its exit code when the
  :class:`envace.serving.Server` handle says it died), so the run stops and can resume.
- :func:`load_hf_backend` — the in-process ``--backend hf`` route: ``AutoModelForCausalLM`` +
  :class:`envace.tiny_model.HFGenerateBackend` (tests and smoke; one sequence at a time).

Verified here: both HTTP backends against a stand-in server in tests; the vLLM request format is the
one vLLM 0.24 documents (not run here: no GPU).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from envace.bench.runner import BackendError

__all__ = ["VLLMCompletionsBackend", "TextCompletionsBackend", "load_hf_backend"]

_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "stop")


class _HTTPBackend:
    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY", timeout: float = 600.0,
                 server: Any = None, seed: int | None = None) -> None:
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.server = server
        self.seed = seed
        self.requests = 0

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url, data=data, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise BackendError(f"model server {self.url} answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            died = ""
            if self.server is not None and self.server.poll() is not None:
                died = f" (the server process exited with code {self.server.poll()})"
            raise BackendError(f"model server {self.url} failed: {exc}{died}") from exc

    def _body(self, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model}
        for key in _SAMPLING_KEYS:
            if key in params:
                body[key] = params[key]
        if "seed" not in body and self.seed is not None:
            body["seed"] = self.seed + self.requests
        self.requests += 1
        return body

    @staticmethod
    def _choice(reply: dict[str, Any]) -> dict[str, Any]:
        try:
            return reply["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendError(f"malformed completion reply: {str(reply)[:300]}") from exc


class VLLMCompletionsBackend(_HTTPBackend):
    """Token-id completions against vLLM's OpenAI server (see the module docstring)."""

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """Returns ``(token_ids, logprobs)``, both of length ``T``."""
        body = self._body(sampling_params)
        body.update(prompt=list(prompt_ids), logprobs=1, return_tokens_as_token_ids=True,
                    skip_special_tokens=False)
        choice = self._choice(await asyncio.to_thread(self._post, body))
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        try:
            ids = [int(str(t).rsplit(":", 1)[1]) for t in tokens]
        except (IndexError, ValueError) as exc:
            msg = f"server did not return token ids (return_tokens_as_token_ids): {tokens[:3]}"
            raise BackendError(msg) from exc
        logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or [0.0] * len(ids)]
        return ids, logprobs


class TextCompletionsBackend(_HTTPBackend):
    """Text completions for ``transformers serve`` (see the module docstring for the trade-off)."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, **kwargs: Any) -> None:
        super().__init__(base_url, model, **kwargs)
        self.tokenizer = tokenizer
        self.turn_end_ids = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """Returns ``(token_ids, logprobs)`` (log-probs are 0: the server does not report them)."""
        body = self._body(sampling_params)
        body["prompt"] = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        choice = self._choice(await asyncio.to_thread(self._post, body))
        text = choice.get("text")
        if not isinstance(text, str):
            raise BackendError(f"completion reply without text: {str(choice)[:300]}")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        max_tokens = int(sampling_params.get("max_tokens", 0) or 0)
        if max_tokens and len(ids) > max_tokens:
            ids = ids[:max_tokens]
        elif choice.get("finish_reason") != "length" and ids[-len(self.turn_end_ids):] != self.turn_end_ids:
            ids = ids + self.turn_end_ids
        return ids, [0.0] * len(ids)


def load_hf_backend(model_path: str, seed: int) -> tuple[Any, Any]:
    """In-process backend: ``(HFGenerateBackend, tokenizer)`` for a local HF model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.tiny_model import HFGenerateBackend

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.eval()
    eos = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    return HFGenerateBackend(model, eos_token_ids=eos[-1:], seed=seed), tokenizer
