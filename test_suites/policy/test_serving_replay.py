"""serving_replay: a serving log replayed through the training path.

The logs are written by the demo policy's own serving path outside the gate (serving
preprocessing, the shipped ONNX artifact in ONNX Runtime) on fresh raw observations: the clean
log passes; a log from a serving path with stale normalisation statistics fails by name; a log
of observations the probes never spanned says so; bad records are exit 2 naming the file, line
and field; a log larger than its bound is exit 2 naming the bound's key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from policy_zoo import evaluate_all, fault_config
from test_bad_input import assert_input_error, run_in_process, write_config


def serve(clean: Path, raw: np.ndarray, normalise: Any, artifact: Path | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """What the demo's serving path returns for raw observations: (model inputs, logits)."""
    import onnxruntime as ort

    x = np.asarray(normalise(raw, stats_path=clean / "obs_norm.json"), np.float32)
    session = ort.InferenceSession(str(artifact or clean / "policy.onnx"),
                                   providers=["CPUExecutionProvider"])
    return x, session.run(None, {"obs": x})[0]


def write_log(clean: Path, out: Path, *, normalise: Any = None, scale: float = 1.0,
              fmt: str = "jsonl", count: int = 300, artifact: Path | None = None) -> Path:
    from paritygate.demo import policy

    raw = policy.probe_observations(count, 7) * np.float32(scale)
    x, served = serve(clean, raw, normalise or policy.normalize_serving, artifact)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = out / "serving.parquet"
        table = pa.table({"obs": raw.tolist(), "served": served.tolist(),
                          "preprocessed": x.tolist(),
                          "timestamp": pa.array(np.arange(count, dtype=np.int64) * 1_000_000,
                                                pa.timestamp("us"))})
        pq.write_table(table, path, row_group_size=128)
        return path
    if fmt == "npz":
        path = out / "serving.npz"
        np.savez_compressed(path, obs=raw, served=served, preprocessed=x,
                            timestamp=np.arange(count, dtype=np.float64))
        return path
    path = out / "serving.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"obs": raw[i].tolist(), "served": served[i].tolist(),
                                     "preprocessed": x[i].tolist(),
                                     "timestamp": f"2026-12-01T00:00:{i % 60:02d}Z"}) + "\n")
    return path


def replay(clean: Path, out: Path, log: Path, **extra: Any) -> Any:
    config = fault_config(clean, out, {"policy": {"serving_log": {"path": str(log), **extra}}})
    return evaluate_all(config, ("serving_replay",))["serving_replay"]


@pytest.mark.parametrize("fmt", ["jsonl", "npz", "parquet"])
def test_clean_log_passes(clean_demo: Path, tmp_path: Path, fmt: str) -> None:
    log = write_log(clean_demo, tmp_path / "log", fmt=fmt)
    result = replay(clean_demo, tmp_path / "gate", log, chunk=64)
    assert result.status == "pass", result.message
    assert result.metrics["records"] == 300
    assert result.metrics["records_over_tolerance"] == 0
    assert result.metrics["preprocessed_max_abs_diff"] <= 1e-5


def stale_serving(clean: Path, folder: Path) -> Any:
    """The demo's serving normaliser reading last release's statistics (the zoo's
    ``stale_norm_stats`` fault), whatever stats path it is given."""
    import policy_zoo_builders as zb

    from paritygate.demo import faults

    stats = Path(zb.stale_stats(clean, folder)["policy"]["preprocessing"]["stats"])
    return lambda raw, stats_path: faults.normalize_serving_stale(raw, stats_path=stats)


def test_stale_normalisation_in_serving_fails_by_name(clean_demo: Path, tmp_path: Path) -> None:
    log = write_log(clean_demo, tmp_path / "log",
                    normalise=stale_serving(clean_demo, tmp_path / "stats"))
    result = replay(clean_demo, tmp_path / "gate", log)
    assert result.status == "fail"
    kinds = result.finding_kinds()
    assert "serving_preprocessing_differs" in kinds and "served_outputs_differ" in kinds, kinds
    assert "line " in result.message
    worst = result.details["worst_records"]
    assert len(worst) == 5 and worst[0]["where"].startswith("line ")


def test_stale_normalisation_in_a_parquet_log_fails_by_name(clean_demo: Path,
                                                           tmp_path: Path) -> None:
    log = write_log(clean_demo, tmp_path / "log", fmt="parquet",
                    normalise=stale_serving(clean_demo, tmp_path / "stats"))
    result = replay(clean_demo, tmp_path / "gate", log, chunk=64)
    kinds = result.finding_kinds()
    assert "serving_preprocessing_differs" in kinds and "served_outputs_differ" in kinds, kinds
    assert result.metrics["records"] == 300
    assert result.details["worst_records"][0]["timestamp"].startswith("1970-01-01T00:")


def test_served_actions_compare_with_the_training_argmax(clean_demo: Path,
                                                         tmp_path: Path) -> None:
    from paritygate.demo import policy

    raw = policy.probe_observations(200, 7)
    for label, normalise in (("clean", policy.normalize_serving),
                             ("stale", stale_serving(clean_demo, tmp_path / "stats"))):
        _, logits = serve(clean_demo, raw, normalise)
        path = tmp_path / f"{label}.jsonl"
        path.write_text("".join(json.dumps({"obs": raw[i].tolist(),
                                            "served": int(np.argmax(logits[i]))}) + "\n"
                                for i in range(len(raw))), encoding="utf-8")
        result = replay(clean_demo, tmp_path / f"gate-{label}", path, served="action")
        if label == "clean":
            assert result.status == "pass", result.message
        else:
            assert "served_outputs_differ" in result.finding_kinds(), result.message


def test_observations_outside_the_probes_are_named(clean_demo: Path, tmp_path: Path) -> None:
    log = write_log(clean_demo, tmp_path / "log", scale=4.0)
    result = replay(clean_demo, tmp_path / "gate", log)
    assert "probes_miss_served_inputs" in result.finding_kinds(), result.message
    assert result.metrics["coverage_worst_outside"] > 0.2


@pytest.mark.parametrize(("line", "key", "cause"), [
    ('{"served": [0, 0, 0, 0]}', "line 3.obs", "missing"),
    ('{"obs": [1, 2], "served": [0, 0, 0, 0]}', "line 3.obs", "shape [2], expected [8]"),
    ('{"obs": [1, 2, 3, 4, 5, 6, 7, 0], "served": "x"}', "line 3.served", "not a number"),
    ('{"obs": [1, 2, 3, 4, 5, 6, 7, 0], "served": [0, 0, 0, 0], "timestamp": []}',
     "line 3.timestamp", "a number or a string"),
    ("not json", "line 3", "not JSON"),
])
def test_bad_record_is_bad_input(clean_demo: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str], line: str, key: str,
                                 cause: str) -> None:
    log = write_log(clean_demo, tmp_path / "log", count=4)
    lines = log.read_text(encoding="utf-8").splitlines()
    lines[2] = line
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = write_config(tmp_path / "gate", clean_demo,
                          {"policy": {"serving_log": {"path": str(log)}}})
    assert_input_error(*run_in_process(capsys, config), file=log,
                       key=f"policy.serving_log: {key}", cause=cause)


def _parquet(path: Path, **columns: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=2)
    return path


_OBS = [[0.1] * 8] * 4
_SERVED = [[0.0] * 4] * 4


@pytest.mark.parametrize(("columns", "key", "cause"), [
    ({"served": _SERVED}, "obs", "missing column"),
    ({"obs": [*_OBS[:3], [1.0, 2.0]], "served": _SERVED}, "row 3.obs",
     "a list of 2, expected 8"),
    ({"obs": [*_OBS[:2], None, _OBS[3]], "served": _SERVED}, "row 2.obs", "null"),
    ({"obs": _OBS, "served": [["a"] * 4] * 4}, "row 0.served", "not numbers"),
    ({"obs": _OBS, "served": [*_SERVED[:3], [0.0, None, 0.0, 0.0]]}, "row 3.served",
     "null inside the array"),
])
def test_bad_parquet_record_is_bad_input(clean_demo: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         columns: dict[str, Any], key: str, cause: str) -> None:
    log = _parquet(tmp_path / "serving.parquet", **columns)
    config = write_config(tmp_path / "gate", clean_demo,
                          {"policy": {"serving_log": {"path": str(log), "chunk": 2}}})
    assert_input_error(*run_in_process(capsys, config), file=log,
                       key=f"policy.serving_log: {key}", cause=cause)


def test_parquet_is_read_in_record_batches(clean_demo: Path, tmp_path: Path) -> None:
    """Chunks of ``chunk`` rows, never the whole table (O(chunk) memory)."""
    from paritygate.families.policy.serving_log import Layout, read_chunks

    log = write_log(clean_demo, tmp_path / "log", fmt="parquet")
    sizes = [len(c) for c in read_chunks(log, Layout({"obs": (8,)}, (4,)), 50, 10**6)]
    assert sizes == [50] * 6


@pytest.mark.parametrize("fmt", ["jsonl", "npz", "parquet"])
def test_log_over_its_bound_is_bad_input(clean_demo: Path, tmp_path: Path, fmt: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(clean_demo, tmp_path / "log", count=20, fmt=fmt)
    config = write_config(tmp_path / "gate", clean_demo,
                          {"policy": {"serving_log": {"path": str(log), "max_records": 10}}})
    assert_input_error(*run_in_process(capsys, config), file=log,
                       key="policy.serving_log.max_records", cause="more than 10")


def test_stale_serving_stats_root_is_preprocessing_parity(clean_demo: Path,
                                                          tmp_path: Path) -> None:
    """The gate's serving preprocessing reads the stale stats too: preprocessing_parity names
    the fault, and the replayed records that differ are its consequence."""
    import policy_zoo_builders as zb

    from paritygate.rootcause import explain

    stale = zb.stale_stats(clean_demo, tmp_path / "stats")
    log = write_log(clean_demo, tmp_path / "log",
                    normalise=stale_serving(clean_demo, tmp_path / "stats2"))
    stale["policy"]["serving_log"] = {"path": str(log)}
    config = fault_config(clean_demo, tmp_path / "gate", stale)
    results = list(evaluate_all(config, ("preprocessing_parity", "serving_replay")).values())
    explained, root = explain(results)
    assert root is not None and root.check == "preprocessing_parity", root
    assert {r.id: r.consequence_of for r in explained}["serving_replay"] == "preprocessing_parity"


def test_an_older_model_in_serving_is_named(clean_demo: Path, tmp_path: Path) -> None:
    """Serving preprocesses right but runs an artifact of a checkpoint 1e-4 away (an older
    one, 1e-3 relative): the model, not the preprocessing, is named."""
    import policy_zoo_builders as zb

    artifact = tmp_path / "old" / "policy.onnx"
    zb._export(zb._inference_model(zb._perturbed(zb._state(clean_demo), 1e-3)), artifact)
    log = write_log(clean_demo, tmp_path / "log", artifact=artifact)
    result = replay(clean_demo, tmp_path / "gate", log)
    kinds = result.finding_kinds()
    assert "served_model_differs" in kinds and "served_outputs_differ" in kinds, kinds
    assert "serving_preprocessing_differs" not in kinds
    clean = replay(clean_demo, tmp_path / "gate-clean", write_log(clean_demo, tmp_path / "c"))
    assert "served_model_differs" not in clean.finding_kinds()
