"""Records that cross module boundaries: the metrics' statistics, rollout_parity's episode
rows, and the report's table templates, which must write what the fragments always wrote."""

from __future__ import annotations

import dataclasses
import html
import math

import numpy as np
import pytest

from paritygate.metrics import DiffStats, DistributionStats, diff_stats, distribution_stats
from paritygate.report.render import table_html, table_markdown


def test_diff_stats_is_a_frozen_record() -> None:
    ref = np.array([[1.0, 2.0], [3.0, 4.0]])
    stats = diff_stats(ref, ref + np.array([[0.0, 0.5], [0.0, 0.0]]))
    assert isinstance(stats, DiffStats)
    assert stats.max_abs == 0.5 and stats.max_rel == 0.25
    assert stats.as_dict() == {"max_abs": 0.5, "mean_abs": 0.125, "p99_abs": stats.p99_abs,
                               "max_rel": 0.25}
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.max_abs = 0.0  # type: ignore[misc]
    empty = diff_stats(np.zeros((0, 2)), np.zeros((0, 2)))
    assert empty == DiffStats(0.0, 0.0, 0.0, 0.0)
    nonfinite = diff_stats(ref, ref * np.nan)
    assert all(math.isnan(v) for v in nonfinite.as_dict().values())


def test_distribution_stats_is_a_frozen_record() -> None:
    ref = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
    cand = np.array([[0.0, 2.0, -1.0], [0.0, 3.0, 0.0]])
    stats = distribution_stats(ref, cand, top_k=1)
    assert isinstance(stats, DistributionStats)
    assert stats.argmax_agreement == 0.5 and stats.topk_overlap == 0.0
    assert stats.worst[0] == 0 and stats.kl_per_row[1] == 0.0 < stats.kl_max
    assert set(stats.as_dict()) == {"kl_mean", "kl_max", "tv_mean", "tv_max", "topk_overlap",
                                    "argmax_agreement", "worst", "kl_per_row"}
    bad = cand.copy()
    bad[0, 0] = np.inf
    nonfinite = distribution_stats(ref, bad)
    assert math.isnan(nonfinite.kl_max) and nonfinite.worst == []


def test_episode_row_dict_has_action_keys_only_where_the_actions_parted() -> None:
    from paritygate.checks.rollout_parity import EpisodeRow

    row = EpisodeRow(episode=0, seed=7, training_return=10.0, artifact_return=10.0,
                     training_length=10, artifact_length=10, first_divergent_step=None,
                     margin=None, verdict="agree", observation_max_abs_diff=0.0)
    assert list(row.to_json()) == [
        "episode", "seed", "training_return", "artifact_return", "training_length",
        "artifact_length", "first_divergent_step", "margin", "verdict",
        "observation_max_abs_diff"]
    parted = dataclasses.replace(row, first_divergent_step=3, margin=0.5, verdict="diverged",
                                 training_action="0", artifact_action="1")
    assert parted.to_json()["training_action"] == "0"
    assert list(parted.to_json())[-2:] == ["training_action", "artifact_action"]


def test_episode_table_renders_from_report_json_rows() -> None:
    from paritygate.checks.rollout_parity import EpisodeRow
    from paritygate.report.rollout import HEADER, episode_cells

    row = EpisodeRow(episode=1, seed=3, training_return=9.5, artifact_return=7.25,
                     training_length=10, artifact_length=8, first_divergent_step=4,
                     margin=1.5, verdict="diverged", observation_max_abs_diff=0.0,
                     training_action="1", artifact_action="0")
    cells = episode_cells([row])
    assert cells == [["1", "3", "9.5 / 7.25", "10 / 8", "4", "1.5", "1 / 0", "diverged"]]
    assert table_markdown(HEADER, cells).splitlines()[-1] == (
        "| 1 | 3 | 9.5 / 7.25 | 10 / 8 | 4 | 1.5 | 1 / 0 | diverged |")


@pytest.mark.parametrize("cells", [[], [["1", "a|b"], ["<2>", "'x' & \"y\""]]])
def test_table_templates_write_what_the_fragments_wrote(cells: list[list[str]]) -> None:
    header = ["n", "what <it> is"]
    md = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                    *("| " + " | ".join(row) + " |" for row in cells)])
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in cells)
    assert table_markdown(header, cells) == md
    assert table_html(header, cells) == f"<table><tr>{head}</tr>{body}</table>"


def test_detail_records_serialise_to_their_keys_and_read_back_as_attributes() -> None:
    """A check's records land in its details under their fields' names (or a key named as it
    runs) and read back, from the live details or from report.json, as the same records;
    a record the check did not write reads as None."""
    import json

    from paritygate.checks._artifact_origin import InitializerRecord
    from paritygate.checks.logits_agreement import WorstProbe, WorstProbes
    from paritygate.checks.reward_parity import RewardRecord, RewardSample
    from paritygate.records import Keyed
    from paritygate.result import Measurement

    m = Measurement("reward_parity")
    samples = [RewardSample("a", 0.5, 0.25, 0.25, "serving", False)]
    m.record(RewardRecord({"training": {"padding_side": "left"}}, samples))
    m.record(Keyed("user_function", "trainer.logprobs"))
    assert m.details == {"layout": {"training": {"padding_side": "left"}},
                         "samples": [{"id": "a", "training": 0.5, "serving": 0.25,
                                      "moved": 0.25, "cut": "serving", "read_at_pad": False}],
                         "user_function": "trainer.logprobs"}
    back = RewardRecord.read(json.loads(json.dumps(m.details)))
    assert back is not None and back.samples == samples and back.samples[0].moved == 0.25
    assert WorstProbes.read(m.details) is None
    probe = WorstProbe(3, 0.5, None, 1, 2)
    assert "position" not in probe.to_json()  # written only for an LM's scored token
    assert WorstProbes.read({"worst_probes": [probe.to_json()]}) == WorstProbes([probe])
    # a report written before the initializers named their target networks still reads
    old = {"initializers": {"comparable": 2, "matched": 2, "folded": 0, "unmatched": [],
                            "misplaced": {}, "drifted": [], "max_rel_drift": 0.0,
                            "not_in_model": ["fc.weight"]}}
    record = InitializerRecord.read(old)
    assert record is not None and record.initializers.not_in_model == ["fc.weight"]
    assert record.initializers.target_networks == []
