"""The endpoint engine (``engines: [endpoint]``) against a real ``vllm serve`` of the demo LM
(vLLM's CPU build in .ci/vllm): the clean server passes the LM checks it serves; a server
started with another temperature (``--override-generation-config``, read from the dev-mode
``/server_info`` and measured) and one with a short ``--max-model-len`` and another
``--generation-config`` (measured: a production server does not say) fail with their causes;
a refused connection, a model the server does not serve and a timeout are bad input naming the
URL. One server per configuration, started once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lm_zoo import variant_config
from served import free_port, vllm_server

from paritygate.engines.vllm_engine import vllm_unavailable_reason

_REASON = vllm_unavailable_reason()
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(_REASON is not None, reason=f"vLLM unavailable: {_REASON}")]

CHECKS = ["sampling_config", "logprob_delta", "generation_parity", "behaviour_parity",
          "batch_invariance"]


@pytest.fixture(scope="module")
def served_copy(demo_lm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo LM without its value head, as ``paritygate export`` writes it."""
    from paritygate.families.causal_lm.export import servable_copy

    return servable_copy(demo_lm, ["v_head."])


def _config(demo_lm: Path, out: Path, url: str, **endpoint: Any) -> dict[str, Any]:
    data = variant_config(demo_lm, out, None)
    lm = data["causal_lm"]
    lm["engines"] = ["endpoint"]
    lm["endpoint"] = {"base_url": url, "model": "demo", **endpoint}
    lm["behaviour"] = {"samples": 16}
    lm["engine"]["logprobs_mode"] = "raw"
    data["name"] = "endpoint"
    data["checks"] = CHECKS
    return data


def _run(data: dict[str, Any], out: Path) -> dict[str, Any]:
    from paritygate.gate import Gate
    from paritygate.load import config_from_dict

    gate = Gate(config_from_dict(data, out / "gate.yaml"))
    return {check: gate.evaluate(check, golden=False) for check in data["checks"]}


def _root(results: dict[str, Any]) -> str | None:
    from paritygate.rootcause import explain

    root = explain(list(results.values()))[1]
    return None if root is None else f"{root.check}:{root.kind}"


def test_clean_server_passes_and_failures_to_answer_name_the_url(
        demo_lm: Path, served_copy: Path, tmp_path: Path) -> None:
    """One server (never two at once: a CI runner holds one CPU engine's memory)."""
    from paritygate.errors import InputError

    with vllm_server(served_copy, tmp_path / "serve.log", name="demo", dev_mode=True) as url:
        results = _run(_config(demo_lm, tmp_path, url), tmp_path)
        refused = f"http://127.0.0.1:{free_port()}/v1"
        cases = [(_config(demo_lm, tmp_path, refused, retries=1), refused, "no answer"),
                 (_config(demo_lm, tmp_path, url, model="other"), url, "not 'other'"),
                 (_config(demo_lm, tmp_path, url, timeout_s=0.001, retries=0), url,
                  "timed out")]
        errors = []
        for data, where, says in cases:
            data["checks"] = ["generation_parity"]
            with pytest.raises(InputError) as caught:
                _run(data, tmp_path)
            errors.append((where, says, caught.value.line()))
    for check, result in results.items():
        assert result.status == "pass", (check, result.message)
    server = results["sampling_config"].details["server"]
    assert server["max_model_len"] == 256 and server["defaults"]["override"] == {}
    probe = results["sampling_config"].details["server_defaults_probe"]
    assert probe["differing"] == [] and probe["inconclusive"] is None, probe
    assert probe["prompts"] >= 4 and probe["tokens"] >= 32, probe
    assert results["behaviour_parity"].details["sources"]["serving"].startswith(
        f"endpoint {url}")
    assert results["batch_invariance"].details["engine"] == "endpoint"
    for where, says, line in errors:
        assert where in line and says in line, line


def test_server_temperature_fails_with_its_cause(demo_lm: Path, served_copy: Path,
                                                 tmp_path: Path) -> None:
    with vllm_server(served_copy, tmp_path / "serve.log", "--override-generation-config",
                     json.dumps({"temperature": 0.5}), name="demo", dev_mode=True) as url:
        results = _run(_config(demo_lm, tmp_path, url), tmp_path)
    # Named once, with the value /server_info reads; the measurement agrees on the field.
    assert results["sampling_config"].finding_kinds() == ["server_default_differs"]
    assert "0.5" in results["sampling_config"].message
    probe = results["sampling_config"].details["server_defaults_probe"]
    assert probe["differing"] == ["temperature"] and not probe["combined"], probe
    assert results["behaviour_parity"].status == "fail", results["behaviour_parity"].message
    assert _root(results) == "sampling_config:server_defaults"
    for check in ("logprob_delta", "generation_parity", "batch_invariance"):
        assert results[check].status == "pass", (check, results[check].message)


def test_short_max_model_len_and_another_generation_config_fail_with_their_causes(
        demo_lm: Path, served_copy: Path, tmp_path: Path) -> None:
    """A production server (no dev mode) with two faults, each named by its own kind: a
    context under the longest probe plus max_new_tokens, and a ``--generation-config``
    folder whose temperature is not the served directory's (only measurable)."""
    from paritygate.families.causal_lm import build_context
    from paritygate.load import config_from_dict

    data = _config(demo_lm, tmp_path, "http://127.0.0.1:1/v1")
    ctx = build_context(config_from_dict(data, tmp_path / "gate.yaml"))
    longest = max(len(p) for p in ctx.serving.prompts)
    folder = tmp_path / "generation"
    folder.mkdir()
    generation = json.loads((served_copy / "generation_config.json").read_text())
    generation["temperature"] = 0.5
    (folder / "generation_config.json").write_text(json.dumps(generation))
    with vllm_server(served_copy, tmp_path / "serve.log", "--max-model-len", str(longest + 4),
                     "--generation-config", str(folder), name="demo") as url:
        data["causal_lm"]["endpoint"]["base_url"] = url
        results = _run(data, tmp_path)
    sampling = results["sampling_config"]
    assert sorted(sampling.finding_kinds()) == ["server_default_differs",
                                                "server_max_model_len"], sampling.message
    assert sampling.details["server"]["defaults"] is None  # not exposed: measured
    assert sampling.details["server_defaults_probe"]["differing"] == ["temperature"]
    assert sampling.status == "fail"
    assert _root(results) in ("sampling_config:server_context", "sampling_config:server_defaults")
    assert results["batch_invariance"].status == "skip", results["batch_invariance"].message
