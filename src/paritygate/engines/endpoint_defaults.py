"""Which sampling defaults a server applies to a request that leaves a field out, measured
without asking the server for its configuration.

A production ``vllm serve`` exposes no endpoint listing the defaults it applies
(``--generation-config``, the served directory's ``generation_config.json``,
``--override-generation-config``): ``/server_info`` exists only with
``VLLM_SERVER_DEV_MODE=1``, and ``/v1/models`` lists the model and its ``max_model_len``.
So the defaults are measured: each probe prompt is sampled with one seed

- with every sampling field sent with the serving config's value (twice: the baseline must
  repeat itself exactly, else the probe is inconclusive),
- with every field left out (the server's defaults), and, where that differs,
- with one field left out at a time, naming the fields whose default is not the serving
  config's value.

Requests go one at a time (each alone in the server's batch, so numerics do not depend on
batch-mates) with ``ignore_eos`` (every sample is ``max_tokens`` long) and ask for the
sampled tokens' log-probs: a default that changes the sampled tokens, or their log-probs
under ``--logprobs-mode processed_logprobs``, is seen. A default that changes neither on
the probes (a ``top_p`` of 0.99 that never cuts a sampled token) is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from paritygate.engines.generation import SamplingSpec
from paritygate.engines.openai_endpoint import EndpointEngine, parse_choice

PROBE_PROMPTS = 8
"""Probe prompts sampled (the first ones that fit the server's context)."""

PROBE_TOKENS = 32
"""Tokens sampled per prompt at most (fewer where the serving config's ``max_new_tokens``
or the server's context is smaller)."""

LOGPROB_ATOL = 1e-5
"""Log-probs of the same tokens further apart than this differ (the baseline repeats exactly)."""

SEED = 7919
"""The probe's seed (prompt ``i`` is sampled with ``SEED + i``)."""


@dataclass(frozen=True)
class DefaultsProbe:
    """What the probe saw: the fields whose server default is not the serving value."""

    differing: tuple[str, ...]
    """Fields whose omission changed the samples (empty: the defaults agree on the probes)."""
    sent: dict[str, float]
    """The serving config's values the explicit requests sent."""
    prompts: int
    tokens: int
    """Tokens sampled per set of requests (each prompt up to :data:`PROBE_TOKENS`, within
    the server's context)."""
    inconclusive: str | None = None
    """Why nothing could be concluded (the baseline did not repeat, no prompt fits)."""
    combined: bool = False
    """The defaults differ only together (no single field's omission changes the samples)."""


def serving_fields(sampling: SamplingSpec) -> dict[str, float]:
    """The request fields ``sampling: server`` leaves to the server, with the serving values."""
    return {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p),
            "top_k": float(sampling.top_k if sampling.top_k > 0 else -1),
            "min_p": float(sampling.min_p),
            "repetition_penalty": float(sampling.repetition_penalty)}


def _same(a: list[tuple[list[int], list[float]]], b: list[tuple[list[int], list[float]]]
          ) -> bool:
    return all(ta == tb and all(abs(x - y) <= LOGPROB_ATOL for x, y in zip(la, lb, strict=True))
               for (ta, la), (tb, lb) in zip(a, b, strict=True))


def probe_defaults(engine: EndpointEngine, prompts: Sequence[Sequence[int]],
                   sampling: SamplingSpec) -> DefaultsProbe:
    """Sample ``prompts`` with and without the serving values (see the module docstring)."""
    limit = engine.info().max_model_len
    most = max(1, min(int(sampling.max_new_tokens), PROBE_TOKENS))
    fit = [(list(p), min(most, limit - len(p)) if limit is not None else most)
           for p in prompts if p]
    fit = [(p, n) for p, n in fit if n >= 1][:PROBE_PROMPTS]
    sent = serving_fields(sampling)
    tokens = sum(n for _, n in fit)
    if not fit:
        return DefaultsProbe((), sent, 0, 0, "no probe prompt fits the server's context")
    one_at_a_time = dataclasses.replace(engine, concurrency=1, findings=[])
    url = engine.url("completions")

    def sample(fields: dict[str, float]) -> list[tuple[list[int], list[float]]]:
        bodies = []
        for i, (prompt, count) in enumerate(fit):
            body = engine.body(prompt, None, logprobs=0)
            body.update(fields, max_tokens=count, seed=SEED + i, ignore_eos=True)
            bodies.append(body)
        out = []
        for choices in one_at_a_time.complete(bodies):
            done = parse_choice(choices[0], url, want_logprobs=True)
            out.append((done.token_ids, done.logprobs))
        return out

    explicit = sample(sent)
    if not _same(explicit, sample(sent)):
        return DefaultsProbe((), sent, len(fit), tokens,
                             "the same seeded request sampled different tokens twice")
    if _same(explicit, sample({})):
        return DefaultsProbe((), sent, len(fit), tokens)
    differing = tuple(name for name in sent
                      if not _same(explicit, sample({k: v for k, v in sent.items()
                                                     if k != name})))
    return DefaultsProbe(differing or tuple(sent), sent, len(fit), tokens,
                         combined=not differing)
