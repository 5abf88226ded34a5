"""behaviour_parity's report section: the per-statistic table (test, p-value, effect, each
side's value), the sample size that would detect a given effect, and behaviour.png: the two
sides' completion-length distributions and stop-reason rates (matplotlib, the ``plots``
extra; without it the section has the tables only)."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path

from paritygate.checks.behaviour_parity import BehaviourRecord
from paritygate.fragments import Rendered
from paritygate.metrics.behaviour import StatRow
from paritygate.report.render import section
from paritygate.result import CheckResult

SIDES = ("training", "serving")
COLOURS = {"training": "#4063a0", "serving": "#d07020"}


def _counts(value: object) -> dict[str, dict[str, int]]:
    """``{side: {label: count}}`` from details (JSON: anything else is dropped)."""
    if not isinstance(value, Mapping):
        return {}
    return {str(side): {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
            for side, counts in value.items() if isinstance(counts, Mapping)}


def plot_behaviour(lengths: dict[str, dict[str, int]], stops: dict[str, dict[str, int]],
                   path: Path) -> Path | None:
    """behaviour.png: length distribution per side (left) and stop-reason rates (right)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from paritygate.files import atomic_savefig

    fig = Figure(figsize=(9.0, 3.2))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.16, wspace=0.3)
    ax_len, ax_stop = fig.subplots(1, 2)
    for offset, side in ((-0.2, "training"), (0.2, "serving")):
        counts = lengths.get(side, {})
        total = max(1, sum(counts.values()))
        xs = sorted(int(k) for k in counts)
        ax_len.bar([x + offset for x in xs], [counts[str(x)] / total for x in xs], width=0.4,
                   color=COLOURS[side], label=side)
        reasons = stops.get(side, {})
        every = max(1, sum(reasons.values()))
        names = ["eos", "stop", "length", "other"]
        ax_stop.bar([i + offset for i in range(len(names))],
                    [reasons.get(n, 0) / every for n in names], width=0.4,
                    color=COLOURS[side], label=side)
        ax_stop.set_xticks(range(len(names)), names)
    ax_len.set_xlabel("completion length, tokens")
    ax_len.set_ylabel("fraction of samples")
    ax_len.set_title("behaviour_parity: length distribution")
    ax_stop.set_ylabel("fraction of samples")
    ax_stop.set_title("stop reasons")
    ax_len.legend(fontsize=7)
    return atomic_savefig(fig, path, dpi=90)


def render_behaviour(result: CheckResult, report_dir: Path, *, figures: bool = True
                     ) -> Rendered:
    """The statistics table, the sample-size guidance and behaviour.png (with ``figures``)."""
    record = BehaviourRecord.read(result.details)
    stats = record.statistics if record is not None else None
    if record is None or not isinstance(stats, Mapping) or not stats:
        return Rendered()
    rows = []
    for name, row in stats.items():
        if not isinstance(row, StatRow):
            continue
        interval = (f"[{row.low:+.3g}, {row.high:+.3g}]"
                    if row.low is not None and row.high is not None else "")
        rows.append([str(name), row.test,
                     f"{row.p:.2g}" if isinstance(row.p, float) else interval,
                     f"{row.effect:+.3g}", f"{row.training:.4g}", f"{row.serving:.4g}",
                     "yes" if row.rejected else "no"])
    note = (f"Holm at alpha {record.alpha} over the tests, "
            f"{record.samples_per_prompt} samples per prompt per side")
    main = section("behaviour_parity", ["statistic", "test", "p (or 95% interval)", "effect",
                                      "training", "serving", "differs"], rows, note)
    guide = record.samples_to_detect
    extra = section("behaviour_parity: samples per side to detect an effect (90% power)",
                  ["effect", "samples per side"],
                  [[str(k), str(v)] for k, v in guide.items()] if isinstance(guide, Mapping)
                  else [])
    png = (plot_behaviour(_counts(record.length_histogram), _counts(record.stop_reasons),
                          Path(report_dir) / "behaviour.png") if figures else None)
    if not figures:  # an earlier run's figure would not be this run's
        (Path(report_dir) / "behaviour.png").unlink(missing_ok=True)
    image = ""
    if png is not None:
        encoded = base64.b64encode(png.read_bytes()).decode()
        image = (f'<img alt="{html.escape("behaviour_parity lengths and stop reasons")}" '
                 f'src="data:image/png;base64,{encoded}"/>')
    return Rendered(markdown="\n\n".join(x for x in (main.markdown, extra.markdown) if x),
                    html=main.html + extra.html + image,
                    files=[str(png)] if png is not None else [])
