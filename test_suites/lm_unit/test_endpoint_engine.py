"""The endpoint engine's reading of completions responses and its failures to get one: every
one is bad input naming the URL and the field. No server is faked: responses are parsed as
records, and a refused connection is a real port with nothing listening (the real-server
tests are ``test_suites/lm/test_endpoint_real.py``)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from paritygate.engines.generation import SamplingSpec
from paritygate.engines.openai_endpoint import EndpointEngine, parse_choice, prompt_logprobs
from paritygate.errors import InputError

URL = "http://127.0.0.1:1/v1/completions"


def _choice(**changes: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "finish_reason": "length", "stop_reason": None, "token_ids": [7, 9],
        "logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, -1.0],
                     "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -1.5},
                                      {"token_id:9": -1.0, "token_id:4": -1.2}]}}
    choice.update(changes)
    return choice


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_choice_reads_ids_logprobs_and_top_k() -> None:
    done = parse_choice(_choice(), URL, want_logprobs=True)
    assert done.token_ids == [7, 9] and done.logprobs == [-0.5, -1.0]
    assert done.top_logprobs[1] == {9: -1.0, 4: -1.2} and done.finish_reason == "length"


@pytest.mark.parametrize(("changes", "key", "says"), [
    ({"logprobs": None}, "choices.logprobs", "ignores 'logprobs'"),
    ({"logprobs": {"tokens": ["hello", "x"], "token_logprobs": [-1, -1]}},
     "logprobs.tokens", "return_tokens_as_token_ids"),
    ({"token_ids": [7, 8]}, "choices.logprobs.tokens", "differ"),
    ({"logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": None,
                   "top_logprobs": [{"token_id:7": -0.5}, {"token_id:4": -1.2}]}},
     "choices.logprobs.token_logprobs", "only top-k log-probs"),
    ({"logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, "x"],
                   "top_logprobs": None}}, "token_logprobs", "not a number"),
])
def test_a_malformed_choice_is_bad_input_naming_the_url(changes: dict[str, Any], key: str,
                                                        says: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_choice(_choice(**changes), URL, want_logprobs=True)
    assert caught.value.file == URL and key in (caught.value.key or "")
    assert says in caught.value.cause


def test_top_k_only_takes_the_sampled_token_from_the_top_k() -> None:
    choice = _choice(logprobs={"tokens": ["token_id:7", "token_id:9"], "token_logprobs": None,
                               "top_logprobs": [{"token_id:7": -0.5}, {"token_id:9": -1.0}]})
    assert parse_choice(choice, URL, want_logprobs=True).logprobs == [-0.5, -1.0]


def test_prompt_logprobs_score_each_token_after_the_first() -> None:
    entries = [None, {"5": {"logprob": -2.0}}, {"6": {"logprob": -0.25}}]
    assert prompt_logprobs({"prompt_logprobs": entries}, [1, 5, 6], URL) == [-2.0, -0.25]
    with pytest.raises(InputError, match="ignores 'prompt_logprobs'"):
        prompt_logprobs({}, [1, 5, 6], URL)


def test_a_refused_connection_is_bad_input_naming_the_url_after_the_retries() -> None:
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    engine = EndpointEngine(base, "m", retries=1, timeout_s=5)
    with pytest.raises(InputError) as caught:
        engine.generate([[1, 2]], SamplingSpec(max_new_tokens=2))
    line = caught.value.line()
    assert line.startswith(f"{base}/models") and "no answer" in line and "2 attempt(s)" in line


def test_the_api_key_is_read_by_name_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    engine = EndpointEngine(base, "m", api_key_env="PG_TEST_KEY", retries=0, timeout_s=5)
    with pytest.raises(InputError, match="PG_TEST_KEY is not set"):
        engine.info()
    monkeypatch.setenv("PG_TEST_KEY", "sk-secret-value")
    with pytest.raises(InputError) as caught:
        engine.info()
    assert "sk-secret-value" not in caught.value.line()


def test_sampling_is_left_to_the_server_or_sent() -> None:
    spec = SamplingSpec(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=3)
    server = EndpointEngine("http://h/v1", "m").body([1], spec, request=2, logprobs=1)
    assert "temperature" not in server and server["seed"] == 5 and server["max_tokens"] == 8
    sent = EndpointEngine("http://h/v1", "m", sampling="request").body([1], spec)
    assert sent["temperature"] == 0.7 and sent["top_p"] == 0.9 and sent["top_k"] == -1
    greedy = EndpointEngine("http://h/v1", "m").body([1], spec.greedy())
    assert greedy["temperature"] == 0.0 and "seed" not in greedy


def test_engines_endpoint_needs_its_block(tmp_path: Any) -> None:
    from paritygate.families.causal_lm import build_context
    from paritygate.load import config_from_dict

    data = {"name": "x", "family": "causal_lm",
            "causal_lm": {"model_dir": str(tmp_path), "sampling": {"training": "t.yaml"},
                          "probes": "p.jsonl", "engines": ["endpoint"]}}
    with pytest.raises(InputError) as caught:
        build_context(config_from_dict(data, tmp_path / "gate.yaml"))
    assert caught.value.key == "causal_lm.endpoint"
