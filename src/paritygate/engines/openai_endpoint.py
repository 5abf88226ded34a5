"""An OpenAI-compatible completions server (``vllm serve``, SGLang, TGI...) as a
:class:`~paritygate.engines.base.GenerationEngine`: the engine under test is the service
itself, with its own defaults, not a copy of it run in-process.

Requests go to ``{base_url}/completions`` with the prompt as token ids (the completions API
takes a list of ids), ``logprobs=k`` for the sampled token's log-prob and the top k, and
vLLM's extra fields ``return_tokens_as_token_ids`` and ``return_token_ids`` so every token
comes back as an id, never as text to re-tokenize. Teacher-forced scoring uses
``prompt_logprobs`` (vLLM), with ``max_tokens: 1``. ``{base_url}/models`` names the served
model and, on vLLM, its ``max_model_len``.

Sampling fields are sent or left to the server (``sampling: server``): a request without
``temperature``, ``top_p``, ``top_k``, ``min_p`` or ``repetition_penalty`` is sampled with
the server's defaults (vLLM: its ``--generation-config``, the served directory's
``generation_config.json`` by default, and ``--override-generation-config``), which is what
a client that does not set them gets. Greedy requests always send ``temperature: 0``.

Only the standard library talks HTTP. Every failure to get an answer (refused connection,
timeout after the bounded retries, an HTTP error, a body that is not the completions
schema) is :class:`~paritygate.errors.InputError` naming the URL: exit 2. An API key is read
from the environment variable the config names and is sent only as a bearer header; it is
never written to a report, a log or an error.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from paritygate.engines.generation import Generation, SamplingSpec
from paritygate.errors import InputError

MAX_RESPONSE_BYTES = 64 << 20
"""Largest response body read (64 MiB): a gate's few probes need far less."""

RETRY_PAUSE_S = 1.0
"""Seconds between retries of a request that got no answer (doubling each time)."""

SERVER_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""Fields left to the server's defaults under ``sampling: server``."""

SamplingSource = Literal["server", "request"]


@dataclass(frozen=True)
class ServerInfo:
    """What ``GET {base_url}/models`` says about the served model."""

    model: str
    max_model_len: int | None
    """vLLM's ``max_model_len`` (``None``: the server does not say)."""
    root: str | None
    """Where the server loaded the model from (vLLM ``root``), when it says."""


@dataclass(frozen=True)
class ServerFinding:
    """Something the server did that the request did not ask for, seen in a response."""

    kind: Literal["ignored_field", "top_k_only", "truncated"]
    message: str


@dataclass
class Completion:
    """One choice of a completions response, with every token as an id."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]
    finish_reason: str
    stop_reason: object = None


def _token_id(text: object, url: str) -> int:
    if isinstance(text, str) and text.startswith("token_id:"):
        try:
            return int(text[len("token_id:"):])
        except ValueError:
            pass
    raise InputError(url, "logprobs.tokens",
                     f"token {str(text)[:40]!r} is not 'token_id:N' (the server ignores "
                     "return_tokens_as_token_ids: serve with vLLM, or a server that returns ids)")


def _finite(value: object, url: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(url, where, f"not a number: {str(value)[:40]!r}")
    return float(value)


def parse_choice(choice: object, url: str, *, want_logprobs: bool) -> Completion:
    """One ``choices[i]`` of a completions response (vLLM's ids and log-probs), or bad input
    naming the URL and the field that is missing or malformed."""
    if not isinstance(choice, dict):
        raise InputError(url, "choices", "a choice is not an object")
    finish = str(choice.get("finish_reason") or "")
    ids = choice.get("token_ids")
    lp = choice.get("logprobs")
    tokens: list[int] | None = None
    if isinstance(ids, list):
        tokens = [int(t) for t in ids if isinstance(t, int)]
        if len(tokens) != len(ids):
            raise InputError(url, "choices.token_ids", "not a list of token ids")
    values: list[float] = []
    tops: list[dict[int, float]] = []
    if want_logprobs:
        if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
            raise InputError(url, "choices.logprobs",
                             "no log-probs in the response (the server ignores 'logprobs')")
        listed = [_token_id(t, url) for t in lp["tokens"]]
        if tokens is None:
            tokens = listed
        elif listed != tokens:
            raise InputError(url, "choices.logprobs.tokens", "differ from choices.token_ids")
        sampled = lp.get("token_logprobs")
        top = lp.get("top_logprobs") or [None] * len(tokens)
        if not isinstance(top, list) or len(top) != len(tokens):
            raise InputError(url, "choices.logprobs.top_logprobs", "one entry per token expected")
        for j, token in enumerate(tokens):
            entry = top[j] if isinstance(top[j], dict) else {}
            alternatives = {_token_id(k, url): _finite(v, url, "top_logprobs")
                            for k, v in entry.items()}
            value = sampled[j] if isinstance(sampled, list) and j < len(sampled) else None
            if value is None:
                if token not in alternatives:
                    raise InputError(url, "choices.logprobs.token_logprobs",
                                     f"token {j} (id {token}) has no log-prob: the server "
                                     "returns only top-k log-probs and the sampled token is "
                                     "not among them")
                value = alternatives[token]
            values.append(_finite(value, url, "token_logprobs"))
            tops.append(alternatives)
    if tokens is None:
        raise InputError(url, "choices", "no token ids (send return_token_ids or logprobs)")
    return Completion(tokens, values, tops, finish, choice.get("stop_reason"))


def prompt_logprobs(choice: Mapping[str, object], ids: Sequence[int], url: str) -> list[float]:
    """The log-prob of ``ids[t]`` given ``ids[:t]`` for ``t >= 1``, from vLLM's
    ``prompt_logprobs`` (one ``{"<id>": {"logprob": x}}`` per prompt token, ``None`` first)."""
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise InputError(url, "choices.prompt_logprobs",
                         "no prompt log-prob per prompt token (the server ignores "
                         "'prompt_logprobs': teacher-forced scoring needs it)")
    out: list[float] = []
    for t in range(1, len(ids)):
        entry = entries[t]
        found = entry.get(str(ids[t])) if isinstance(entry, dict) else None
        value = found.get("logprob") if isinstance(found, dict) else None
        out.append(_finite(value, url, f"prompt_logprobs[{t}]"))
    return out


@dataclass
class EndpointEngine:
    """Completions over HTTP from an OpenAI-compatible server (see the module docstring)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    retries: int = 2
    concurrency: int = 8
    top_logprobs: int = 5
    logprobs_mode: str = "raw"
    sampling: SamplingSource = "server"
    name: str = "endpoint"
    findings: list[ServerFinding] = field(default_factory=list)
    """What responses showed the server did unasked (read by the checks)."""
    _info: ServerInfo | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise InputError(self.base_url, "causal_lm.endpoint.api_key_env",
                                 f"environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _call(self, path: str, body: Mapping[str, object] | None = None) -> dict[str, object]:
        """GET (``body`` None) or POST JSON, retried ``retries`` times when no answer came."""
        url = self.url(path)
        data = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(RETRY_PAUSE_S * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, headers=self._headers(),
                                             method="GET" if body is None else "POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read(MAX_RESPONSE_BYTES + 1)
            except urllib.error.HTTPError as exc:
                detail = exc.read(2000).decode("utf-8", "replace")
                if exc.code >= 500 or exc.code == 429:
                    last = f"HTTP {exc.code}: {detail}"
                    continue
                raise InputError(url, None, f"HTTP {exc.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"no answer ({type(reason).__name__}: {reason})"
                continue
            if len(raw) > MAX_RESPONSE_BYTES:
                raise InputError(url, None, f"response over {MAX_RESPONSE_BYTES} bytes")
            try:
                parsed = json.loads(raw)
            except (ValueError, RecursionError):
                raise InputError(url, None, "the response is not JSON: "
                                 f"{raw[:80].decode('utf-8', 'replace')!r}") from None
            if not isinstance(parsed, dict):
                raise InputError(url, None, "the response is not a JSON object")
            return parsed
        raise InputError(url, None, f"{last} after {self.retries + 1} attempt(s) of "
                         f"{self.timeout_s:g} s (causal_lm.endpoint.timeout_s, retries)")

    def info(self) -> ServerInfo:
        """The served model as ``GET /models`` lists it (checked once, then cached)."""
        if self._info is None:
            url = self.url("models")
            listing = self._call("models").get("data")
            if not isinstance(listing, list):
                raise InputError(url, "data", "not a model list")
            cards = {str(c.get("id")): c for c in listing if isinstance(c, dict)}
            card = cards.get(self.model)
            if card is None:
                raise InputError(url, "causal_lm.endpoint.model",
                                 f"the server serves {', '.join(sorted(cards)) or 'no model'}, "
                                 f"not {self.model!r}")
            length = card.get("max_model_len")
            self._info = ServerInfo(self.model, length if isinstance(length, int) else None,
                                    str(card["root"]) if card.get("root") else None)
        return self._info

    def body(self, prompt: Sequence[int], sampling: SamplingSpec | None, *, request: int = 0,
             logprobs: int | None = None, greedy: bool = False) -> dict[str, object]:
        """The completions request for one prompt (``sampling`` None: scoring only)."""
        body: dict[str, object] = {"model": self.model, "prompt": [int(t) for t in prompt],
                                   "return_tokens_as_token_ids": True, "return_token_ids": True}
        if logprobs is not None:
            body["logprobs"] = logprobs
        if sampling is None:
            return body
        body["max_tokens"] = int(sampling.max_new_tokens)
        if sampling.min_new_tokens:
            body["min_tokens"] = int(sampling.min_new_tokens)
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.eos_token_ids:
            body["stop_token_ids"] = [int(t) for t in sampling.eos_token_ids]
        if greedy or not sampling.do_sample:
            body["temperature"] = 0.0
            return body
        if sampling.seed is not None:
            body["seed"] = int(sampling.seed) + request
        if self.sampling == "request":
            body.update(temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                        top_k=int(sampling.top_k) if sampling.top_k > 0 else -1,
                        min_p=float(sampling.min_p),
                        repetition_penalty=float(sampling.repetition_penalty))
        return body

    def complete(self, bodies: list[dict[str, object]]) -> list[list[dict[str, object]]]:
        """Send ``bodies`` concurrently (``concurrency`` at a time); each one's choices."""
        self.info()
        url = self.url("completions")

        def one(body: dict[str, object]) -> list[dict[str, object]]:
            choices = self._call("completions", body).get("choices")
            count = int(body.get("n", 1))  # type: ignore[call-overload]
            if not isinstance(choices, list) or len(choices) != count:
                raise InputError(url, "choices", f"expected {count} choice(s)")
            return [c if isinstance(c, dict) else {} for c in choices]

        if len(bodies) <= 1 or self.concurrency <= 1:
            return [one(b) for b in bodies]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            return list(pool.map(one, bodies))

    def note(self, finding: ServerFinding) -> None:
        with self._lock:
            if finding not in self.findings:
                self.findings.append(finding)

    def _check_length(self, done: Completion, body: Mapping[str, object], prompt_len: int
                      ) -> None:
        asked = int(body.get("max_tokens", 0))  # type: ignore[call-overload]
        got = len(done.token_ids)
        url = self.url("completions")
        if got > asked:
            self.note(ServerFinding("ignored_field", f"{url} returned {got} tokens for "
                                    f"max_tokens {asked}: the server ignores max_tokens"))
        elif done.finish_reason == "length" and got < asked:
            limit = self.info().max_model_len
            self.note(ServerFinding("truncated", f"{url} ended a completion at {got} of "
                                    f"{asked} tokens (finish_reason length) after a "
                                    f"{prompt_len}-token prompt: the server's max_model_len "
                                    f"{limit if limit is not None else '?'} cuts it"))

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec) -> Generation:
        """One completion per prompt, with the sampled tokens' log-probs (and the top k)."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        k = self.top_logprobs
        bodies = [self.body(p, sampling, request=i, logprobs=k) for i, p in enumerate(prompts)]
        url = self.url("completions")
        out_ids, values, tops = [], [], []
        for body, prompt, choices in zip(bodies, prompts, self.complete(bodies), strict=True):
            done = parse_choice(choices[0], url, want_logprobs=True)
            self._check_length(done, body, len(prompt))
            if k and any(len(t) < min(k, 1) for t in done.top_logprobs):
                self.note(ServerFinding("top_k_only", f"{url} returned no top log-probs for "
                                        f"logprobs {k}: the server ignores the field"))
            out_ids.append(done.token_ids)
            values.append(done.logprobs)
            tops.append(done.top_logprobs)
        return Generation([list(p) for p in prompts], out_ids, values,
                          tops if k else None, self.logprobs_mode, self.name)

    def sample_n(self, prompts: list[list[int]], sampling: SamplingSpec, n: int
                 ) -> tuple[Generation, list[str]]:
        """``n`` samples of each prompt and how each ended (``eos``, ``stop``, ``length``).

        One request per sample, each with its own seed (``seed + i``), sent concurrently:
        the samples are reproducible, and no request asks vLLM's CPU build to fork a seeded
        generator (``n > 1`` with a seed kills its engine: "CPU Generator does not use
        offset")."""
        from paritygate.engines.dump_stream import finish_from_vllm

        pairs = [(p, self.body(p, sampling, request=i * n + j))
                 for i, p in enumerate(prompts) for j in range(n)]
        url = self.url("completions")
        rows: list[tuple[list[int], list[int], str]] = []
        answers = self.complete([body for _, body in pairs])
        for (prompt, body), choices in zip(pairs, answers, strict=True):
            done = parse_choice(choices[0], url, want_logprobs=False)
            self._check_length(done, body, len(prompt))
            rows.append((list(prompt), done.token_ids,
                         finish_from_vllm(done.finish_reason, done.stop_reason)))
        gen = Generation([p for p, _, _ in rows], [o for _, o, _ in rows], [[] for _ in rows],
                         None, self.logprobs_mode, self.name)
        return gen, [r for _, _, r in rows]

    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Teacher-forced raw log-probs of each completion after its prompt, from the
        server's ``prompt_logprobs`` (requests sent concurrently, as one batch)."""
        rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        bodies = [{**self.body(r, None), "max_tokens": 1, "temperature": 0.0,
                   "prompt_logprobs": 0} for r in rows]
        url = self.url("completions")
        out = []
        for row, prompt, choices in zip(rows, prompts, self.complete(bodies), strict=True):
            scored = prompt_logprobs(choices[0], row, url)
            out.append(scored[len(prompt) - 1:])
        return out


def server_findings(engine: object) -> list[str]:
    """What an endpoint's responses showed it did unasked (a cut completion, an ignored
    field), as report notes; empty for any other engine."""
    if not isinstance(engine, EndpointEngine):
        return []
    return [f"server ({finding.kind.replace('_', ' ')}): {finding.message}"
            for finding in engine.findings]


def server_defaults(engine: EndpointEngine) -> dict[str, object] | None:
    """The sampling defaults vLLM applies to a request that leaves a field out, where the
    server exposes its configuration (``GET /server_info``: vLLM started with
    ``VLLM_SERVER_DEV_MODE=1``): ``--override-generation-config``'s fields, and
    ``generation_config`` (``auto``: the served directory's file; ``vllm``: vLLM's neutral
    defaults; a path). ``None``: the server does not say."""
    root = engine.base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    probe = EndpointEngine(root, engine.model, api_key_env=engine.api_key_env,
                           timeout_s=engine.timeout_s, retries=0)
    try:
        info = probe._call("server_info?config_format=json")
    except InputError:
        return None
    config = info.get("vllm_config")
    model = config.get("model_config") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return None
    override = model.get("override_generation_config")
    return {"generation_config": model.get("generation_config"),
            "override": dict(override) if isinstance(override, dict) else {}}
