"""Probe rows holding NaN/Inf: left out of the model inputs with a word in every model check's
record; a probe set with no finite row is bad input (exit 2 naming the probe file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from policy_zoo import base_config, merge

from paritygate import cli
from paritygate.demo.policy import probe_observations
from paritygate.gate import Gate
from paritygate.load import load_config

MODEL_CHECKS = ("batchnorm_export", "head_removal", "dropout_off", "logits_agreement",
                "export_integrity")


def _config(clean: Path, folder: Path, probes: np.ndarray) -> Path:
    np.save(folder / "probes.npy", probes)
    data = merge(base_config(clean), {"policy": {"probes": {"generator": None,
                                                            "file": "probes.npy"}}})
    data["golden"] = {"dir": str(folder / "golden")}
    path = folder / "gate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_dropped_rows_are_counted_in_every_model_check(clean_demo: Path, tmp_path: Path) -> None:
    probes = probe_observations(64, seed=0)
    probes[::4, 2] = np.nan  # 16 rows with a missing value
    probes[1, 0] = np.inf  # and one with an infinity
    gate = Gate(load_config(_config(clean_demo, tmp_path, probes)))
    assert len(gate.context.probes) == 47
    for check_id in MODEL_CHECKS:
        result = gate.evaluate(check_id, golden=False)
        assert result.status == "pass", (check_id, result.message)
        assert result.metrics["probe_rows_dropped"] == 17, check_id
        notes = result.details["notes"]
        assert any("17 of 64 probe rows hold NaN/Inf" in n and "47 rows used" in n
                   for n in notes), (check_id, notes)
    prep = gate.evaluate("preprocessing_parity", golden=False)
    assert "probe_rows_dropped" not in prep.metrics  # it compares every row, NaN included


def test_finite_probes_add_nothing(clean_demo: Path, tmp_path: Path) -> None:
    gate = Gate(load_config(_config(clean_demo, tmp_path, probe_observations(16, seed=0))))
    result = gate.evaluate("head_removal", golden=False)
    assert "probe_rows_dropped" not in result.metrics
    assert "notes" not in result.details


@pytest.mark.parametrize("fill", [np.nan, np.inf], ids=["nan", "inf"])
def test_no_finite_row_is_bad_input(clean_demo: Path, tmp_path: Path, capsys, fill) -> None:
    probes = probe_observations(8, seed=0)
    probes[:, 3] = fill
    config = _config(clean_demo, tmp_path, probes)
    capsys.readouterr()
    code = cli.main(["run", str(config)])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out + err
    assert str(tmp_path / "probes.npy") in lines[0]
    assert ": policy.probes.file: all 8 probe rows hold NaN/Inf" in lines[0]
