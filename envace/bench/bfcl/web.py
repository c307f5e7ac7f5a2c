"""BFCL-v4 web search (``web_search_base``, ``web_search_no_snippet``): the search and page-fetch tools
answered from a recorded-response cache (replay) or, when a user configures it, live.

Implemented:
- :class:`ResponseCache`: a JSONL file, one record per request: ``{"kind": "search" | "fetch",
  "request": {...}, "response": {...}}``, keyed by the SHA-256 of the canonical JSON of kind + request.
  A search request is SerpAPI's parameters without the key (``engine``, ``q``, ``kl``); its response is
  SerpAPI's JSON as returned (``organic_results``, or ``error``). A fetch request is ``{"url"}``; its
  response is ``{"status", "url" (after redirects), "text"}`` or ``{"error"}``. :meth:`sha256` hashes the
  file's bytes (recorded in every manifest). New records are appended, flushed and fsynced one by one, so
  a killed live run keeps every response it got; a torn last line is dropped with a message on load.
- :class:`WebBackend`: ``mode: replay`` answers only from the cache (a request not in it becomes a
  structured error observation, counted per episode as ``cache_misses``); ``mode: live`` asks SerpAPI
  (the ``serpapi`` client bfcl-eval itself uses, engine ``duckduckgo`` as in bfcl-eval) with the key from
  the environment variable the config names, never written anywhere (redacted from every response
  before it is stored or shown, e.g. a failed request's URL), and fetches pages through
  :func:`guarded_get`; every live response is stored in the cache (so a re-run, or another site with the
  cache file, replays it exactly).
- :func:`guarded_get`: ``http``/``https`` only; the host is resolved once and every address must be a
  public one (no loopback, private, link-local, shared, multicast, reserved or unspecified address); the
  connection goes to that checked address (the TLS name check still uses the host name), so a second DNS
  answer cannot redirect it; redirects are followed by hand (at most :data:`MAX_REDIRECTS`), each hop
  checked the same way; a timeout and a size cap bound every response.
- :func:`web_search_api_class` (``EnvaceWebSearchAPI``): bfcl-eval's ``WebSearchAPI`` with its two tools
  answered through a :class:`WebBackend`. Subclassed because bfcl-eval has no hook: its
  ``search_engine_query`` calls ``GoogleSearch(params).get_dict()`` and its ``fetch_url_content`` calls
  ``requests.get(url)`` on the model's URL inline
  (``bfcl_eval/eval_checker/multi_turn_eval/func_source_code/web_search.py`` of bfcl-eval 2026.3.23, guarded
  by :data:`PINNED_BFCL_EVAL`). What the overrides keep from bfcl-eval: the
  tool signatures, ``show_snippet`` (set by bfcl-eval's own ``_load_scenario``), the result format
  (``title``/``href``/``body`` from ``organic_results``, at most ``max_results``; the error dict when there
  are none) and the fetch modes ``raw`` / ``markdown`` (``html2text``) / ``truncate`` (BeautifulSoup
  text without scripts and styles). Where they differ: bfcl-eval retries SerpAPI's 429 forever with
  back-off; here a live 429 is retried :data:`LIVE_RETRIES` times, then returned as the error observation
  (a run never hangs on a quota). Model text never reaches a shell or ``eval``; a URL reaches the network
  only through :func:`guarded_get`, in live mode.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import socket
import sys
import time
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

__all__ = ["ResponseCache", "WebBackend", "guarded_get", "UnsafeURLError",
           "web_search_api_class", "PINNED_BFCL_EVAL", "MAX_REDIRECTS"]

PINNED_BFCL_EVAL = "2026.3.23"
MAX_REDIRECTS = 5
LIVE_RETRIES = 3
MODES = ("replay", "live")


def _key(kind: str, request: dict[str, Any]) -> str:
    text = json.dumps({"kind": kind, "request": request}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResponseCache:
    """The recorded requests and responses of web-search runs (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                self.records[_key(record["kind"], record["request"])] = record
            except (ValueError, KeyError, TypeError):
                print(f"envace: web-search cache {self.path}: line {number} is unreadable (a torn write?); "
                      "ignored", file=sys.stderr)

    def get(self, kind: str, request: dict[str, Any]) -> dict[str, Any] | None:
        record = self.records.get(_key(kind, request))
        return None if record is None else record["response"]

    def put(self, kind: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        record = {"kind": kind, "request": request, "response": response}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records[_key(kind, request)] = record

    def sha256(self) -> str:
        """SHA-256 of the cache file's bytes (``"absent"`` when there is no file)."""
        if not self.path.exists():
            return "absent"
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


class UnsafeURLError(ValueError):
    """A URL the live fetcher refuses (scheme, host, or an address that is not public)."""


def _public_address(host: str, port: int) -> str:
    """The first address ``host`` resolves to, if every resolved address is public; else raise."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UnsafeURLError(f"cannot resolve {host!r}: {exc}") from exc
    addresses = [info[4][0] for info in infos]
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])
        mapped = getattr(address, "ipv4_mapped", None)
        if not (mapped or address).is_global:
            raise UnsafeURLError(f"{host!r} resolves to {address}, which is not a public address")
    if not addresses:
        raise UnsafeURLError(f"{host!r} resolves to no address")
    return addresses[0]


def _check_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path+query)`` of an http(s) URL, or raise :class:`UnsafeURLError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURLError(f"only http(s) URLs are fetched, not {url!r}")
    if not parts.hostname or parts.username or parts.password:
        raise UnsafeURLError(f"no host, or credentials in the URL: {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UnsafeURLError(f"bad port in {url!r}") from exc
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.scheme, parts.hostname, port, target


def guarded_get(url: str, timeout_s: float, max_bytes: int) -> dict[str, Any]:
    """GET ``url`` under the rules of the module docstring; ``{"status", "url", "text"}``.

    Raises :class:`UnsafeURLError` for a refused URL or hop, ``OSError``/urllib3 errors for network
    failures; a body over ``max_bytes`` is cut there.
    """
    import urllib3

    for _ in range(MAX_REDIRECTS + 1):
        scheme, host, port, target = _check_url(url)
        address = _public_address(host, port)
        kwargs: dict[str, Any] = {"timeout": urllib3.Timeout(total=timeout_s), "retries": False}
        if scheme == "https":
            pool: Any = urllib3.HTTPSConnectionPool(address, port, server_hostname=host,
                                                    assert_hostname=host, **kwargs)
        else:
            pool = urllib3.HTTPConnectionPool(address, port, **kwargs)
        headers = {"Host": host if port in (80, 443) else f"{host}:{port}",
                   "User-Agent": "envace-bfcl-web-search/1", "Accept": "text/html,*/*;q=0.8"}
        with pool:
            response = pool.urlopen("GET", target, headers=headers, redirect=False, preload_content=False)
            try:
                if response.status in (301, 302, 303, 307, 308) and response.headers.get("Location"):
                    url = urljoin(url, response.headers["Location"])
                    continue
                body = response.read(max_bytes + 1, decode_content=True)[:max_bytes]
            finally:
                response.release_conn()
        charset = re.search(r"charset=([\w-]+)", response.headers.get("Content-Type", ""))
        try:
            text = body.decode(charset.group(1) if charset else "utf-8", errors="replace")
        except LookupError:  # an unknown charset name
            text = body.decode("utf-8", errors="replace")
        return {"status": int(response.status), "url": url, "text": text}
    raise UnsafeURLError(f"more than {MAX_REDIRECTS} redirects")


class WebBackend:
    """Answers search and fetch requests from the cache (replay) or the network (live)."""

    def __init__(self, mode: str, cache: str | Path, api_key_env: str = "SERPAPI_API_KEY",
                 fetch_timeout_s: float = 20.0, fetch_max_bytes: int = 2_000_000) -> None:
        if mode not in MODES:
            raise ValueError(f"benchmarks.bfcl_v4.web_search.mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.cache = ResponseCache(cache)
        self.api_key_env = api_key_env
        self.fetch_timeout_s = fetch_timeout_s
        self.fetch_max_bytes = fetch_max_bytes
        if mode == "live" and not os.environ.get(api_key_env):
            raise ValueError(f"benchmarks.bfcl_v4.web_search.mode is live but the environment variable "
                             f"{api_key_env} (web_search.api_key_env) holding the SerpAPI key is not set")

    def record(self) -> dict[str, str]:
        """What a manifest records: mode, cache path and hash (never the key)."""
        return {"bfcl_web_search_mode": self.mode, "bfcl_web_search_cache": str(self.cache.path),
                "bfcl_web_search_cache_sha256": self.cache.sha256()}

    def search(self, keywords: str, region: str) -> tuple[dict[str, Any], bool]:
        """SerpAPI's JSON for ``keywords`` in ``region``, and whether it came from the cache."""
        request = {"engine": "duckduckgo", "q": str(keywords), "kl": str(region)}
        cached = self.cache.get("search", request)
        if cached is not None or self.mode == "replay":
            return (cached if cached is not None else
                    {"error": f"replay: no recorded search response for {request['q']!r} "
                              f"(region {request['kl']!r})"}), cached is not None
        from serpapi import GoogleSearch  # bfcl-eval's own client (package google-search-results)

        key = os.environ[self.api_key_env]
        response: dict[str, Any] = {}
        for attempt in range(LIVE_RETRIES + 1):
            try:
                response = GoogleSearch({**request, "api_key": key}).get_dict()
            except Exception as exc:  # the client's own errors: an observation, not a crash
                response = {"error": str(exc)}
            if "429" not in str(response.get("error", "")) or attempt == LIVE_RETRIES:
                break
            time.sleep(2 ** (attempt + 1))
        # an error text (a request URL) or an echoed parameter may hold the key: it is never kept
        response = json.loads(json.dumps(response).replace(key, "<redacted>")) if key else response
        self.cache.put("search", request, response)
        return response, False

    def fetch(self, url: str) -> tuple[dict[str, Any], bool]:
        """The page at ``url`` (``{"status", "url", "text"}`` or ``{"error"}``), and whether cached."""
        request = {"url": str(url)}
        cached = self.cache.get("fetch", request)
        if cached is not None or self.mode == "replay":
            return (cached if cached is not None else
                    {"error": f"replay: no recorded page for {request['url']!r}"}), cached is not None
        try:
            response = guarded_get(request["url"], self.fetch_timeout_s, self.fetch_max_bytes)
        except UnsafeURLError as exc:
            return {"error": f"refused: {exc}"}, False  # never stored: a refusal is not a response
        except Exception as exc:  # network failures: an observation
            response = {"error": f"An error occurred while fetching {url}: {exc}"}
        self.cache.put("fetch", request, response)
        return response, False


@cache
def web_search_api_class() -> type:
    """``EnvaceWebSearchAPI``: bfcl-eval's ``WebSearchAPI`` with both tools answered by a
    :class:`WebBackend` (built on first use: importing bfcl-eval's module needs its packages)."""
    version = metadata.version("bfcl-eval")
    if version != PINNED_BFCL_EVAL:
        raise RuntimeError(f"envace's web-search tools override bfcl-eval {PINNED_BFCL_EVAL}'s WebSearchAPI; "
                           f"bfcl-eval {version} is installed: check its web_search.py and update "
                           "envace/bench/bfcl/web.py")
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.web_search import WebSearchAPI

    class _Api(WebSearchAPI):  # type: ignore[misc, valid-type]
        """bfcl-eval's WebSearchAPI answered through a :class:`WebBackend` (see the module docstring)."""

        backend: WebBackend
        cache_hits = 0
        cache_misses = 0

        def _count(self, response: dict[str, Any], cached: bool) -> None:
            if cached:
                self.cache_hits += 1
            elif self.backend.mode == "replay":
                self.cache_misses += 1

        def search_engine_query(self, keywords: str, max_results: int | None = 10,
                                region: str | None = "wt-wt") -> Any:
            response, cached = self.backend.search(keywords, region or "wt-wt")
            self._count(response, cached)
            if "organic_results" not in response:
                if "error" in response and str(response["error"]).startswith("replay:"):
                    return {"error": response["error"]}
                return {"error": "Failed to retrieve the search results from server. Please try again later."}
            keep = ("title", "link", "snippet") if self.show_snippet else ("title", "link")
            names = {"title": "title", "link": "href", "snippet": "body"}
            return [{names[k]: item.get(k, "") for k in keep}
                    for item in response["organic_results"][: int(max_results or 10)]]

        def fetch_url_content(self, url: str, mode: str = "raw") -> Any:
            if not str(url).startswith(("http://", "https://")):
                raise ValueError(f"Invalid URL: {url}")
            if mode not in ("raw", "markdown", "truncate"):
                raise ValueError(f"Unsupported mode: {mode}")
            response, cached = self.backend.fetch(url)
            self._count(response, cached)
            if "error" in response:
                return {"error": response["error"]}
            if not 200 <= int(response.get("status", 200)) < 400:
                return {"error": f"An error occurred while fetching {url}: HTTP {response['status']}"}
            text = response["text"]
            if mode == "markdown":
                import html2text

                return {"content": html2text.HTML2Text().handle(text)}
            if mode == "truncate":
                from bs4 import BeautifulSoup

                soup = BeautifulSoup(text, "html.parser")
                for node in soup(["script", "style"]):
                    node.extract()
                return {"content": soup.get_text(separator="\n", strip=True)}
            return {"content": text}

    _Api.__name__ = _Api.__qualname__ = "EnvaceWebSearchAPI"
    return _Api
