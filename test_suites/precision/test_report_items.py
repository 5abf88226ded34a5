"""What the precision report shows: both ONNX output readings, the ONNX series in the CSV and
the plot, separate leaf/block series with non-finite values marked, per-layer numbers kept out
of the report's metric tables, and the mixed-precision assumption stated."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import onnx
import pytest
import yaml
from precision_zoo import FakeContext, clean_policy, measure, rescaled_policy, subject

from paritygate.precision.plot import _series, _worst
from paritygate.precision.report import PrecisionReport
from paritygate.report import RENDERERS
from paritygate.result import Measurement
from paritygate.verdict import judge


@pytest.fixture(scope="module")
def fp16_onnx(clean_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    path = tmp_path_factory.mktemp("fp16") / "clean16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(clean_onnx)), keep_io_types=True), str(path))
    return path


@pytest.fixture(scope="module")
def overflow(fp16_onnx: Path) -> Measurement:
    """fp16 overflow at blocks.1.up, compared with a clean fp16 artifact as well."""
    return measure(FakeContext(subject(lambda: rescaled_policy(16), onnx_path=fp16_onnx)))


def test_onnx_output_reported_as_served_and_as_read_in_the_marked_copy(
    fp16_onnx: Path, tmp_path: Path
) -> None:
    m = measure(FakeContext(subject(clean_policy, onnx_path=fp16_onnx)))
    onnx_report = m.details["precision"]["onnx"]
    served, marked = onnx_report["output_rel_l2"], onnx_report["marked_output_rel_l2"]
    assert served > 0 and marked > 0
    # the output passes through a Cast in the converted artifact: the head's row reads it
    assert onnx_report["marked_output_row"] == "head"
    head = next(r for r in onnx_report["rows"] if r["layer"] == "head")
    assert math.isclose(head["onnx_rel_l2"], marked, rel_tol=1e-6)
    note = onnx_report["marking_note"]
    if abs(served - marked) > 0.01 * served:
        assert note and "marked as graph outputs" in note and "as served" in note
        assert note in m.notes
    markdown = RENDERERS["precision_per_layer"](judge(m, None, use_golden=False), tmp_path)
    assert "as served" in markdown.markdown and "intermediates marked" in markdown.markdown


def test_csv_has_onnx_columns_and_plot_names_the_worst_layer(
    overflow: Measurement, tmp_path: Path
) -> None:
    rendered = RENDERERS["precision_per_layer"](judge(overflow, None, use_golden=False), tmp_path)
    with open(tmp_path / "precision_layers.csv") as handle:
        rows = list(csv.DictReader(handle))
    up = [r for r in rows if r["layer"] == "blocks.1.up"]
    assert {r["dtype"] for r in up} == {"float16", "bfloat16"}
    assert all(r["onnx_dtype"] == "float16" and float(r["onnx_rel_l2"]) > 0.5 for r in up)
    assert all(r["onnx_over_budget"] == "True" for r in up)
    assert (tmp_path / "precision.png").read_bytes()[:4] == b"\x89PNG"
    report = PrecisionReport.read(overflow.details["precision"])
    assert report.to_json() == overflow.details["precision"]  # the JSON form reads back whole
    assert (7, "blocks.1.up") in _worst(report)
    # non-finite values leave a gap in the line and are listed for their own marker
    fp16_leaves = [r for r in report.dtype_rows("float16") if r.kind == "leaf"]
    x, y, bad = _series(fp16_leaves, "local_rel_l2", 1e-12)
    assert 7 in bad and math.isnan(y[x.index(7)])
    assert all(r.kind == "leaf" for r in fp16_leaves)  # blocks are their own series
    assert "Mixed-precision suggestions are verified" in rendered.markdown


def test_mixed_suggestion_states_its_low_precision_hand_off_assumption(
    overflow: Measurement,
) -> None:
    result = judge(overflow, None, use_golden=False)
    assert "keeping ['blocks.1'] in fp32" in result.message
    assert "float16 hand-offs between modules" in result.message


def test_per_layer_numbers_stay_out_of_the_report_tables(tmp_path: Path) -> None:
    """report.json metrics, JUnit and the HTML metric table hold the headline numbers; the plot
    opens the precision section, before its metric table."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_policy_export_and_paths import _tiny_policy

    from paritygate.gate import Gate
    from paritygate.report import write_reports

    config = _tiny_policy(tmp_path / "gate")
    data = yaml.safe_load(config.read_text())
    data["precision"]["onnx_compare"] = True
    config.write_text(yaml.safe_dump(data))
    gate = Gate.from_path(config, report_dir=tmp_path / "report")
    results = gate.run()
    write_reports(gate, results, tmp_path / "report",
        formats=frozenset({"json", "md", "html", "junit"}))
    (result,) = results
    assert not [n for n in result.metrics if n.count("/") >= 2], result.metrics
    assert "onnx/output_rel_l2" in result.metrics
    junit = (tmp_path / "report" / "junit.xml").read_text()
    assert "blocks.1.up" not in junit
    html = (tmp_path / "report" / "report.html").read_text()
    section = html[html.index('<section class="check" id="precision_per_layer"'):]
    section = section[: section.index("</section>\n", section.index("Every layer's numbers"))]
    assert section.index("<img") < section.index("<th>metric</th>")
    table = section[section.index("<th>metric</th>"):]
    assert len(re.findall(r"<tr><td>", table[: table.index("</table>")])) <= 12


def test_figures_only_when_the_html_page_is_asked(tmp_path: Path) -> None:
    """The default formats (json, md, junit) write no report.html and draw no figure, and the
    process never imports matplotlib; asking for html draws precision.png and embeds it; a
    later run without html removes both, so the folder holds no page of another run."""
    import json
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_policy_export_and_paths import _tiny_policy

    config = _tiny_policy(tmp_path / "gate")
    out = tmp_path / "report"
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from paritygate.gate import Gate\n"
        "from paritygate.report import write_reports\n"
        "gate = Gate.from_path(sys.argv[1])\n"
        "formats = frozenset(sys.argv[3].split(',')) if len(sys.argv) > 3 else None\n"
        "written = write_reports(gate, gate.run(), Path(sys.argv[2]), formats=formats)\n"
        "print(json.dumps({'files': [Path(f).name for f in written.files],\n"
        "                  'matplotlib': 'matplotlib' in sys.modules}))\n"
    )

    def run(*formats: str) -> dict[str, object]:
        proc = subprocess.run([sys.executable, "-c", script, str(config), str(out), *formats],
                              capture_output=True, text=True, check=True)
        done: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
        return done

    lean = run()
    assert sorted(lean["files"]) == sorted(  # type: ignore[arg-type]
        ["precision_layers.csv", "precision.json", "report.json", "report.md", "junit.xml"])
    assert lean["matplotlib"] is False
    full = run("json,md,html")
    assert {"precision.png", "report.html"} <= set(full["files"])  # type: ignore[arg-type]
    assert "junit.xml" not in full["files"]  # type: ignore[operator]
    assert "data:image/png;base64" in (out / "report.html").read_text(encoding="utf-8")
    run()
    assert not (out / "report.html").exists() and not (out / "precision.png").exists()
    assert (out / "junit.xml").is_file()


def test_unknown_report_format_is_bad_input(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_policy_export_and_paths import _tiny_policy

    from paritygate.cli import main

    config = _tiny_policy(tmp_path / "gate")
    assert main(["run", str(config), "--report-format", "md,pdf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["paritygate: error: --report-format: unknown report format 'pdf'; choose "
                   "from json, md, html, junit"]
