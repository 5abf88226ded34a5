"""A served endpoint's own limits and sampling defaults, measured for ``sampling_config``
(``engines: [endpoint]``): a ``max_model_len`` that cuts the longest probe's completion, the
defaults ``--override-generation-config`` sets where the server exposes its configuration,
and the defaults measured by seeded requests with and without each field. Helpers take the
endpoint engine and the serving side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paritygate.records import Record
from paritygate.result import Measurement

if TYPE_CHECKING:
    from paritygate.engines.base import GenerationEngine
    from paritygate.engines.openai_endpoint import EndpointEngine
    from paritygate.families.causal_lm.sides import LMSide


@dataclass(frozen=True)
class ServerInfo(Record):
    """The OpenAI-compatible server: its model, context and sampling defaults."""

    url: str
    model: str | None
    root: str | None
    max_model_len: int | None
    tokens_needed: int
    sampling: object
    defaults: object


@dataclass(frozen=True)
class ServerRecord(Record):
    server: ServerInfo


@dataclass(frozen=True)
class DefaultsProbe(Record):
    """What the server-defaults probe sent and found."""

    differing: list[str]
    sent: object
    prompts: int
    tokens: int
    inconclusive: str | None
    combined: object


@dataclass(frozen=True)
class DefaultsProbeRecord(Record):
    server_defaults_probe: DefaultsProbe



SERVER_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                 "max_new_tokens": "max_new_tokens", "max_tokens": "max_new_tokens"}
"""A server's generation-config fields -> the serving sampling spec's."""


def record_server(m: Measurement, engine: GenerationEngine, serving: LMSide) -> None:
    """``engines: [endpoint]``: the server's own limits and defaults against the serving
    config: a ``max_model_len`` that cuts the longest probe's completion
    (``server_max_model_len``), and a sampling default that is not the serving config's
    (``server_default_differs``: read where the server exposes its configuration, measured
    by seeded requests under ``sampling: server``)."""
    from paritygate.engines.openai_endpoint import EndpointEngine, server_defaults

    assert isinstance(engine, EndpointEngine)
    info = engine.info()
    need = (max((len(p) for p in serving.prompts), default=0)
            + serving.sampling.spec().max_new_tokens)
    defaults = server_defaults(engine)
    m.record(ServerRecord(ServerInfo(engine.base_url, info.model, info.root, info.max_model_len,
                                     need, engine.sampling, defaults)))
    if info.max_model_len is None:
        m.note(f"{engine.base_url} does not report max_model_len: truncation is judged from "
               "the responses (finish_reason length)")
    elif info.max_model_len < need:
        m.fail("server_max_model_len",
               f"the server's max_model_len {info.max_model_len} ({engine.url('models')}) is "
               f"under the longest probe plus max_new_tokens ({need} tokens): it truncates "
               "completions the trainer samples in full")
    named = record_dev_defaults(m, serving, defaults)
    if engine.sampling == "server":
        record_probe(m, engine, serving, named)
    else:
        m.note("sampling: request sends the serving config's values: the server's own "
               "defaults are not measured")


def record_dev_defaults(m: Measurement, serving: LMSide, defaults: dict[str, object] | None
                        ) -> set[str]:
    """The fields ``--override-generation-config`` sets to another value than the serving
    config's, where the server exposes its configuration (vLLM dev mode); the fields named."""
    if defaults is None:
        return set()
    spec = serving.sampling.spec()
    named: set[str] = set()
    override = defaults.get("override")
    for name, value in (override.items() if isinstance(override, dict) else []):
        field = SERVER_FIELDS.get(str(name))
        if field is None or not isinstance(value, (int, float)):
            continue
        expected = getattr(spec, field)
        if float(value) != float(expected):
            named.add(field)
            m.fail("server_default_differs",
                   f"the server overrides {name}: {value!r} (--override-generation-config) "
                   f"vs serving {expected!r} ({serving.sampling.path.name}); requests "
                   f"that leave {name} out get the server's")
    return named


def record_probe(m: Measurement, engine: EndpointEngine, serving: LMSide, named: set[str]
                 ) -> None:
    """The server's defaults measured by seeded requests with and without each field
    (:mod:`paritygate.engines.endpoint_defaults`): a field whose default changes the samples
    fails ``server_default_differs`` (once: ``named`` fields were already failed)."""
    from paritygate.engines.endpoint_defaults import probe_defaults

    spec = serving.sampling.spec()
    if not spec.do_sample or spec.temperature <= 0:
        m.note("the serving config decodes greedily: the server's sampling defaults are not "
               "measured")
        return
    probe = probe_defaults(engine, serving.prompts, spec)
    m.record(DefaultsProbeRecord(DefaultsProbe(list(probe.differing), probe.sent, probe.prompts,
                                               probe.tokens, probe.inconclusive,
                                               probe.combined)))
    source = serving.sampling.path.name
    if probe.inconclusive:
        m.note(f"the server's sampling defaults are not measured: {probe.inconclusive}")
        return
    if not probe.differing:
        m.note(f"the server's sampling defaults agree with {source} on {probe.prompts} seeded "
               f"probe(s) of {probe.tokens} tokens (each request with and without "
               f"{', '.join(probe.sent)})")
        return
    for name in probe.differing:
        if name in named:
            continue
        how = ("together with the other fields" if probe.combined else "alone")
        m.fail("server_default_differs",
               f"the server's default {name} is not {source}'s {probe.sent[name]!r}: seeded "
               f"requests that leave {name} out ({how}) sample other tokens than requests "
               f"that send it ({probe.prompts} probe(s), {probe.tokens} tokens): clients "
               "that do not set it sample with the server's default (vLLM: its "
               "--generation-config or --override-generation-config)")
