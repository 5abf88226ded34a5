"""Report artifacts: CSV and JSON with one row per (dtype, layer), the PNG, the fragments."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from paritygate.report import RENDERERS
from paritygate.verdict import judge


def test_render_writes_csv_json_png_and_fragments(clean_measurement, tmp_path: Path) -> None:
    result = judge(clean_measurement, None, use_golden=False)
    rendered = RENDERERS["precision_per_layer"](result, tmp_path)
    names = sorted(Path(f).name for f in rendered.files)
    assert names == ["precision.json", "precision.png", "precision_layers.csv"]
    report = clean_measurement.details["precision"]
    with open(tmp_path / "precision_layers.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(report["rows"]) == 2 * len({r["layer"] for r in report["rows"]})
    assert {r["dtype"] for r in rows} == {"float16", "bfloat16"}
    assert float(rows[0]["local_rel_l2"]) > 0 and rows[0]["layer"] == "inp"
    assert json.loads((tmp_path / "precision.json").read_text())["rows"] == report["rows"]
    assert (tmp_path / "precision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'src="data:image/png;base64,' in rendered.html
    assert "| float16 |" in rendered.markdown


def test_a_reader_polling_the_report_folder_never_sees_a_partial_png(
    clean_measurement, tmp_path: Path
) -> None:
    """precision.png (and its CSV and JSON) are written atomically: a reader polling while the
    check renders again and again finds the previous whole file or the new one, never less."""
    import threading

    result = judge(clean_measurement, None, use_golden=False)
    RENDERERS["precision_per_layer"](result, tmp_path)
    png = tmp_path / "precision.png"
    done = threading.Event()
    reads: list[bytes] = []

    def poll() -> None:
        while not done.is_set():
            try:
                reads.append(png.read_bytes())
            except FileNotFoundError:
                reads.append(b"")

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(4):
            RENDERERS["precision_per_layer"](result, tmp_path)
    finally:
        done.set()
        reader.join()
    assert len(reads) > 20
    partial = [r for r in reads if not (r.startswith(b"\x89PNG\r\n\x1a\n")
                                        and r.endswith(b"IEND\xaeB`\x82"))]
    assert not partial, f"{len(partial)} of {len(reads)} reads saw a partial PNG"
    assert json.loads((tmp_path / "precision.json").read_text())["rows"]
