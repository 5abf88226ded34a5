"""Every file the gate reads goes through the bounded reader (:mod:`paritygate.reading`,
:mod:`paritygate.reading_text`): no other module in ``src/`` opens a file for reading or hands
a file to a parser, except the few places listed in :data:`ALLOWED` with their reason.

The scan is of the syntax tree: calls of ``open`` in a read mode, ``Path.open``/``read_text``/
``read_bytes``, ``json.load(s)``, ``yaml.*load``, ``np.load``, Parquet readers, ``torch.load``
and its TorchScript / ``torch.export`` kin, ``zipfile.ZipFile``, safetensors ``safe_open`` and
``load_file``, ``onnx.load``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "paritygate"
READER = {"reading.py", "reading_text.py"}

PARSERS = {
    "json.load", "json.loads", "yaml.safe_load", "yaml.load", "yaml.full_load",
    "yaml.unsafe_load", "np.load", "numpy.load", "pq.read_table", "pq.ParquetFile",
    "torch.load", "torch.jit.load", "torch.export.load", "zipfile.ZipFile", "safe_open",
    "load_file", "onnx.load", "onnx.load_model",
}
READS = {"read_text", "read_bytes"}

ALLOWED: dict[tuple[str, str], str] = {
    # (module under src/paritygate, call): why it may read directly
    ("checkpoints.py", "open"): "the checkpoint's bytes read once for digest and tensors, after "
                                "check_input and check_zip_members judged the file",
    ("checkpoints.py", "torch.load"): "weights_only torch files after check_input and the zip "
                                      "members' bound (validation.check_files)",
    ("checkpoints.py", "read_bytes"): "a safetensors file read once for digest and tensors after "
                                      "check_input",
    ("checkpoints.py", "load_file"): "safetensors parses its own bounded header",
    ("checkpoints.py", "zipfile.ZipFile"): "an SB3 zip whose members check_zip_members judged",
    ("provenance.py", "open"): "sha256 of files in fixed-size blocks: no parsing, no growth",
    ("engines/hf_loading.py", "safe_open"): "safetensors headers after check_input; safetensors "
                                            "bounds its own header",
    ("families/causal_lm/weights.py", "load_file"): "safetensors after check_model_dir",
    ("families/causal_lm/weights.py", "safe_open"): "safetensors after check_model_dir",
    ("families/causal_lm/adapter.py", "safe_open"): "adapter safetensors after check_input",
    ("families/causal_lm/export.py", "safe_open"): "safetensors of a directory already checked",
    ("precision/streaming.py", "safe_open"): "tensors streamed one at a time from checked files",
    ("precision/streaming.py", "read_text"): "/proc/meminfo, not an input",
    ("precision/hf.py", "safe_open"): "tensors streamed one at a time from checked files",
    ("init_hf.py", "safe_open"): "paritygate init: tensor names and shapes, no data",
    ("engines/torchscript_engine.py", "torch.jit.load"): "TorchScript needs its path; "
        "check_input and check_zip_members ran first",
    ("engines/torch_export_engine.py", "torch.export.load"): "a .pt2 needs its path; zip and "
        "members checked first, allow_pickle required",
    ("engines/artifact_graph.py", "zipfile.ZipFile"): "names of a checked artifact's members",
    ("engines/openai_endpoint.py", "json.loads"): "an HTTP response body (not a file), at most "
                                                  "MAX_RESPONSE_BYTES",
    ("report/history.py", "json.loads"): "lines of the callbacks' own metrics.jsonl, read "
                                         "through read_text; a bad line is skipped",
    ("engines/rollout_dump.py", "pq.ParquetFile"): "footer's declared size bounded, then row "
                                                   "batches streamed",
    ("engines/dump_stream.py", "pq.ParquetFile"): "row batches streamed, file size bounded",
    ("families/policy/serving_log.py", "zipfile.ZipFile"): "an .npz log read a chunk at a time "
                                                           "from declared headers",
    ("families/policy/serving_log.py", "pq.ParquetFile"): "row batches streamed",
    ("families/policy/export.py", "read_bytes"): "the gate's own export, just written",
    ("report/docgen.py", "read_text"): "the project's own docs and scripts (docs generation)",
    ("precision/render.py", "read_bytes"): "a figure the gate just wrote",
    ("report/rollout.py", "read_bytes"): "a figure the gate just wrote",
    ("report/behaviour.py", "read_bytes"): "a figure the gate just wrote",
    ("workers.py", "read_text"): "a worker's report.json the gate wrote",
    ("workers.py", "json.loads"): "a worker's report.json the gate wrote",
    ("session.py", "read_text"): "the previous report.json the gate wrote",
    ("session.py", "json.loads"): "the previous report.json the gate wrote",
    ("runner.py", "json.loads"): "a check result the gate just serialised",
    ("plugin_run.py", "json.loads"): "pytest user properties the gate set",
    ("plugin.py", "json.loads"): "pytest user properties the gate set",
    ("integrations/common.py", "read_text"): "the report.json the gate just wrote",
    ("integrations/common.py", "json.loads"): "the report.json the gate just wrote",
    ("gate.py", "json.loads"): "the --bless-first step the CLI put in the environment",
    ("report/model.py", "json.loads"): "report.json text already read by the caller",
    ("files.py", "read_text"): "a lock file the gate wrote (its holder's pid)",
    ("demo/__init__.py", "read_text"): "the package's own demo configs",
    ("demo/causal_lm.py", "read_text"): "the package's own demo corpus",
    ("demo/policy.py", "read_text"): "the demo's own stats, just written",
    ("demo/shapes.py", "read_text"): "the demo's own stats, just written",
    ("demo/policy.py", "json.loads"): "the demo's own stats, just written",
    ("demo/shapes.py", "json.loads"): "the demo's own stats, just written",
    ("init_infer.py", "read_text"): "paritygate init: a config it just rendered",
    ("init.py", "yaml.safe_load"): "paritygate init: a config it just rendered",
    ("init_rl.py", "read_text"): "paritygate init: small HF json files it describes",
    ("init_rl.py", "json.loads"): "paritygate init: small HF json files it describes",
    ("init_sb3.py", "zipfile.ZipFile"): "paritygate init: an SB3 zip's data member",
    ("init_sb3.py", "json.loads"): "paritygate init: an SB3 zip's data member",
    ("init_inputs.py", "zipfile.ZipFile"): "paritygate init: members read by read_zip_member",
    ("init_inputs.py", "json.loads"): "paritygate init: a member read by read_zip_member",
    ("init_hf.py", "json.loads"): "paritygate init: text read by read_text",
    ("golden.py", "json.loads"): "depth bounded by reading_text.nesting_depth first; parsed "
                                 "here for the line number of a syntax error",
    ("engines/onnxruntime_engine.py", "onnx.load"): "protobuf needs the path; check_input ran "
                                                    "first and protobuf bounds its own nesting",
    ("precision/onnx_compare.py", "onnx.load"): "an ONNX model the engine already admitted",
    ("init.py", "onnx.load"): "paritygate init: input names of an ONNX artifact",
}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = _name(func.value)
        return f"{inner}.{func.attr}" if inner else func.attr
    return ""


def _mode(call: ast.Call, position: int) -> str:
    args = [a for a in call.args[position:position + 1]]
    args += [k.value for k in call.keywords if k.arg == "mode"]
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return "?"
    return "r"


def _reads(call: ast.Call) -> str | None:
    """The call's name when it reads a file or parses content, else ``None``."""
    name = _name(call.func)
    last = name.rsplit(".", 1)[-1]
    if name == "open":
        return None if set(_mode(call, 1)) & set("wax") else "open"
    if last == "open" and "." in name and name not in ("os.open", "Image.open"):
        base = name.rsplit(".", 1)[0]
        if base.endswith(("archive", "zf", "handle", "loaded")):
            return None  # a member of a zip the reader already admitted
        return None if set(_mode(call, 0)) & set("wax") else "open"
    if last in READS and isinstance(call.func, ast.Attribute):  # Path.read_text, not the reader
        return last
    if name in PARSERS or last in ("safe_open", "load_file"):
        return name if name in PARSERS else last
    return None


@cache
def direct_reads() -> dict[tuple[str, str], list[int]]:
    """``{(module, call): [lines]}`` of every direct read outside the reader."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in READER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (what := _reads(node)):
                found.setdefault((rel, what), []).append(node.lineno)
    return found


def test_every_read_goes_through_the_reader() -> None:
    found = direct_reads()
    stray = {f"{m}:{lines} {call}" for (m, call), lines in found.items()
             if (m, call) not in ALLOWED}
    assert not stray, ("read these through paritygate.reading / reading_text (or allow-list "
                       "with a reason):\n" + "\n".join(sorted(stray)))


def test_the_allow_list_has_no_stale_entry() -> None:
    found = direct_reads()
    stale = sorted(f"{m} {call}" for m, call in ALLOWED if (m, call) not in found)
    assert not stale, stale


def test_the_scan_sees_what_it_forbids() -> None:
    """The scanner flags each form it names (a scan that sees nothing passes vacuously)."""
    source = ("open(p)\nopen(p, 'rb')\nopen(p, 'w')\np.read_text()\np.read_bytes()\n"
              "json.loads(t)\nyaml.safe_load(t)\nnp.load(p)\npq.read_table(p)\n"
              "torch.load(p)\nzipfile.ZipFile(p)\nsafe_open(p, 'pt')\np.open('a')\n")
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    flagged = [_reads(c) for c in sorted(calls, key=lambda c: c.lineno)]
    assert flagged == ["open", "open", None, "read_text", "read_bytes", "json.loads",
                       "yaml.safe_load", "np.load", "pq.read_table", "torch.load",
                       "zipfile.ZipFile", "safe_open", None]
