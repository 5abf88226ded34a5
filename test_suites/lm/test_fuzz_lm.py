"""Bad inputs of the causal-LM family beyond the config: model dirs, tokenizers, sampling
files, probes, the log-prob function, golden files and report dirs, each through the
CLI (``fuzz_contract``).

Every case copies what it breaks into its own folder; the clean demo LM is built once per
session and only read.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from lm_zoo import clean_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_contract import CANARY, Canary, Case, run_cases

NAME = "demo-lm"
Builder = Callable[[dict[str, Any], Path, Path], tuple[str, str | None]]
"""(config dict to edit, clean model dir, case folder) -> (file the line names, key it names)."""


def _model_copy(cfg: dict[str, Any], model: Path, folder: Path, *, weights: bool = True) -> Path:
    """A copy of the demo model dir that the case may break (tokenizer stays the clean one)."""
    copy = folder / "model"
    skip = None if weights else shutil.ignore_patterns("*.safetensors")
    shutil.copytree(model, copy, ignore=skip)
    cfg["causal_lm"]["model_dir"] = str(copy)
    return copy


def _write(path: Path, data: bytes | str) -> Path:
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def _weights(data: Callable[[bytes], bytes]) -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        copy = _model_copy(cfg, model, folder)
        st = copy / "model.safetensors"
        st.write_bytes(data(st.read_bytes()))
        return "model.safetensors", "causal_lm.model_dir"

    return build


def _pytorch_bin(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
    """A model dir with only a pickled ``pytorch_model.bin`` whose payload creates the canary."""
    import torch
    from safetensors.torch import load_file

    copy = _model_copy(cfg, model, folder, weights=False)
    state: dict[str, Any] = dict(load_file(str(model / "model.safetensors")))
    state["_extra"] = Canary(folder / CANARY)
    torch.save(state, copy / "pytorch_model.bin")
    return "pytorch_model.bin", "causal_lm.model_dir"


def _json_edit(name: str, edit: Callable[[dict[str, Any]], Any], *, tokenizer: bool = False,
               key: str = "causal_lm.model_dir") -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        copy = _model_copy(cfg, model, folder)
        if tokenizer:
            cfg["causal_lm"]["tokenizer"] = {"training": str(copy), "serving": str(copy)}
        path = copy / name
        data = json.loads(path.read_text())
        out = edit(data)
        path.write_text(out if isinstance(out, str) else json.dumps(data))
        return name, key

    return build


def _auto_map(kind: str) -> Builder:
    """A model dir whose config (or tokenizer config) names custom code through ``auto_map``;
    the module beside it creates the canary when imported."""

    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        copy = _model_copy(cfg, model, folder)
        _write(copy / "evil.py", f"open({str(folder / CANARY)!r}, 'w')\n"
               "class Evil:\n    pass\n")
        if kind == "model":
            name, key = "config.json", "causal_lm.model_dir"
            edit = {"model_type": "evil_arch", "architectures": ["Evil"],
                    "auto_map": {"AutoConfig": "evil.Evil", "AutoModelForCausalLM": "evil.Evil"}}
        else:
            name, key = "tokenizer_config.json", "causal_lm.tokenizer.training"
            cfg["causal_lm"]["tokenizer"] = {"training": str(copy), "serving": str(copy)}
            edit = {"tokenizer_class": "EvilTokenizer",
                    "auto_map": {"AutoTokenizer": ["evil.Evil", None]}}
        data = json.loads((copy / name).read_text())
        data.update(edit)
        (copy / name).write_text(json.dumps(data))
        return copy.name, key

    return build


def _tokenizer(files: dict[str, bytes | None]) -> Builder:
    """A tokenizer dir copied from the demo with ``files`` replaced (``None`` removes one)."""

    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        tok = folder / "tok"
        tok.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(model / name, tok / name)
        for name, data in files.items():
            if data is None:
                (tok / name).unlink()
            else:
                (tok / name).write_bytes(data)
        cfg["causal_lm"]["tokenizer"]["serving"] = str(tok)
        return "tok", "causal_lm.tokenizer.serving"

    return build


def _sampling(text: str, side: str = "serving") -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        path = _write(folder / f"sampling-{side}.yaml", text)
        cfg["causal_lm"]["sampling"][side] = str(path)
        return path.name, None

    return build


def _sampling_field(side: str, field: str, value: Any) -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        values = yaml.safe_load(Path(cfg["causal_lm"]["sampling"][side]).read_text())
        values[field] = value
        path = _write(folder / f"sampling-{side}.yaml", yaml.safe_dump(values))
        cfg["causal_lm"]["sampling"][side] = str(path)
        return path.name, field

    return build


def _probes(text: str | bytes, key: str | None = "causal_lm.probes") -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        path = _write(folder / "probes.jsonl", text)
        cfg["causal_lm"]["probes"] = str(path)
        return "probes.jsonl", key

    return build


def _logprob_fn(spec: str, source: str | None = None) -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        if source is not None:
            _write(folder / "userfns.py", source)
            cfg["python_path"] = ["."]
        cfg["causal_lm"]["training"]["logprob_fn"] = spec
        return "gate.yaml", "causal_lm.training.logprob_fn"

    return build


def _golden(text: str, key: str) -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        gdir = folder / "golden" / NAME
        gdir.mkdir(parents=True)
        _write(gdir / "weights_load.json", text)
        return "weights_load.json", key

    return build


def _set(dotted: str, value: Callable[[Path], Any], file: str, key: str) -> Builder:
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        node = cfg
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value(folder)
        return file, key

    return build


def _template(text: str) -> Builder:
    """A serving chat template override and one chat probe that goes through it."""
    def build(cfg: dict[str, Any], model: Path, folder: Path) -> tuple[str, str | None]:
        path = _write(folder / "serving.jinja", text)
        cfg["causal_lm"]["tokenizer"]["serving_chat_template"] = str(path)
        probes = _write(folder / "probes.jsonl", json.dumps(
            {"id": "chat-1", "messages": [{"role": "user", "content": "Hi there"}]}) + "\n")
        cfg["causal_lm"]["probes"] = str(probes)
        return "serving.jinja", "causal_lm.tokenizer.serving_chat_template: probe 'chat-1'"

    return build


def _pickled_bytes(folder: Path) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2), "_extra": Canary(folder / CANARY)}, buf)
    return buf.getvalue()


CASES: dict[str, Builder] = {
    # --- model dirs (checkpoint) ---
    "weights-truncated": _weights(lambda b: b[: len(b) // 3]),
    "weights-random-bytes": _weights(lambda b: bytes(range(256)) * 40),
    "weights-empty": _weights(lambda b: b""),
    "weights-pickle-canary": lambda c, m, f: (_weights(lambda b: _pickled_bytes(f))(c, m, f)),
    "pytorch-model-bin-only": _pytorch_bin,
    "model-dir-missing": _set("causal_lm.model_dir", lambda f: str(f / "none"), "none",
                              "causal_lm.model_dir"),
    "config-auto-map": _auto_map("model"),
    "config-corrupt-json": _json_edit("config.json", lambda d: "{\"model_type\": "),
    "config-not-mapping": _json_edit("config.json", lambda d: "[1, 2]"),
    "config-unknown-model-type": _json_edit("config.json", lambda d: d.update(
        model_type="no_such_arch")),
    # --- tokenizers ---
    "tokenizer-config-auto-map": _auto_map("tokenizer"),
    "tokenizer-json-corrupt": _tokenizer({"tokenizer.json": b"{\"version\": "}),
    "tokenizer-json-missing": _tokenizer({"tokenizer.json": None}),
    "tokenizer-dir-missing": _set("causal_lm.tokenizer.serving", lambda f: str(f / "none"),
                                  "none", "causal_lm.tokenizer.serving"),
    # --- sampling files ---
    "sampling-bad-yaml": _sampling("temperature: [1.0\n"),
    "sampling-not-mapping": _sampling("- 1\n- 2\n"),
    "sampling-unknown-field": _sampling_field("serving", "temprature", 0.7),
    "sampling-wrong-type": _sampling_field("serving", "temperature", "hot"),
    "sampling-seed-abc": _sampling_field("training", "seed", "abc"),
    "sampling-negative-temperature": _sampling_field("training", "temperature", -1.0),
    "sampling-missing": _set("causal_lm.sampling.training", lambda f: str(f / "none.yaml"),
                             "none.yaml", "causal_lm.sampling.training"),
    "sampling-not-utf8": _sampling("temperature: \xff\n"),
    # --- probes ---
    "probes-missing": _set("causal_lm.probes", lambda f: str(f / "none.jsonl"), "none.jsonl",
                           "causal_lm.probes"),
    "probes-line-not-mapping": _probes('{"id": "a", "text": "The cat"}\n[1, 2]\n', "line 2"),
    "probes-line-string": _probes('"just a string"\n', "line 1"),
    "probes-invalid-json": _probes('{"id": "a", "text": \n', "line 1"),
    "probes-empty": _probes(""),
    "probes-no-text": _probes('{"id": "a"}\n', "line 1"),
    "probes-text-not-a-string": _probes('{"id": "a", "text": 3}\n', "line 1.text"),
    "probes-not-utf8": _probes(b'{"id": "a", "text": "\xff"}\n'),
    # --- chat templates: the sandbox, syntax, runtime and resources (issue: each exit 2) ---
    "template-sandbox-escape": _template(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    "template-syntax-error": _template("{% for m in messages %}{{ m.content }"),
    "template-runtime-error": _template("{{ (messages | length) // 0 }}"),
    "template-runaway-loop": _template(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"),
    # --- the log-prob function (factory) ---
    "logprob-fn-unimportable": _logprob_fn("no_such_module:fn"),
    "logprob-fn-not-callable": _logprob_fn("paritygate.families.causal_lm.logprobs:__doc__"),
    "logprob-fn-raises": _logprob_fn("userfns:fn", "def fn(*a, **k):\n    raise ValueError('x')\n"),
    # --- golden and report dirs ---
    "golden-corrupt-json": _golden("{\"metrics\": ", "line 1"),
    "golden-not-mapping": _golden("[1]", "metrics"),
    "golden-dir-is-file": _set("golden.dir", lambda f: str(_write(f / "g", "x")), "g",
                               "golden.dir"),
    "report-dir-is-file": _set("report_dir", lambda f: str(_write(f / "r", "x")), "r",
                               "report_dir"),
    "report-dir-under-file": _set("report_dir", lambda f: str(_write(f / "r", "x") / "sub"),
                                  "r", "report_dir"),
}
ARGS: dict[str, tuple[str, ...]] = {
    "golden-corrupt-json": ("--check", "weights_load"),
    "golden-not-mapping": ("--check", "weights_load"),
    "logprob-fn-raises": ("--check", "logprob_impl"),
}
PARALLEL = ("golden-not-mapping", "sampling-seed-abc")
"""Cases also run with ``-n 2``."""


def _cases(model: Path, root: Path) -> list[Case]:
    out = []
    runs = [(cid, ()) for cid in CASES] + [(cid, ("-n", "2")) for cid in PARALLEL]
    for cid, extra in runs:
        case_id = cid + ("-n2" if extra else "")
        folder = root / case_id
        folder.mkdir(parents=True)
        cfg = clean_config(model)
        cfg["golden"] = {"dir": str(folder / "golden")}
        file, key = CASES[cid](cfg, model, folder)
        config = _write(folder / "gate.yaml", yaml.safe_dump(cfg, sort_keys=False))
        out.append(Case(case_id, config, file, key, (*ARGS.get(cid, ()), *extra)))
    return out


def test_lm_bad_inputs_keep_the_contract(demo_lm: Path, tmp_path: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    cases = _cases(demo_lm, tmp_path)
    assert len(cases) >= 30
    lm = clean_config(demo_lm)["causal_lm"]
    files = [v for v in lm["sampling"].values() if isinstance(v, str)]  # not the allow-list
    repo_inputs = [Path(lm["probes"]), *(Path(p) for p in files)]
    broken = run_cases(cases, [demo_lm, *repo_inputs], capfd)
    assert not broken, "\n".join(f"{k}: {v}" for k, v in broken.items())


def test_a_huge_probe_text_is_cut_before_tokenizing(demo_lm: Path, tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """A 20 MB probe is cut by characters (max_prompt_tokens x MAX_CHARS_PER_TOKEN) before the
    tokenizer sees it: the run ends with its verdict in seconds, the probe named in a note."""
    from fuzz_contract import run_here
    from measured_run import cpu_seconds_now

    cfg = clean_config(demo_lm)
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"id": "short", "text": "The cat"}) + "\n"
                      + json.dumps({"id": "huge", "text": "the cat sat. " * 1_600_000}) + "\n",
                      encoding="utf-8")
    cfg["causal_lm"]["probes"] = str(probes)
    cfg["golden"] = {"dir": str(tmp_path / "golden")}
    config = _write(tmp_path / "gate.yaml", yaml.safe_dump(cfg, sort_keys=False))
    start = cpu_seconds_now()
    code, out, err = run_here(Case("huge-probe", config, "", None,
                                   ("--check", "tokenizer_parity", "--allow-skips",
                                    "--report-dir", str(tmp_path / "r"))), capfd)
    assert cpu_seconds_now() - start < 120  # CPU, not wall: tokenizing 20 MB would take more
    assert code in (0, 1) and "Traceback" not in out + err, (code, err[-2000:])
    report = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    notes = [n for c in report["checks"] for n in c.get("details", {}).get("notes", [])]
    assert any("cut to" in n and "huge" in n for n in notes), notes
