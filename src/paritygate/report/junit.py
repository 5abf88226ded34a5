"""junit.xml: one testcase per check; metrics, thresholds and golden values as properties."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET


def _full(value: object) -> str:
    """Full precision: ``repr`` of floats; non-finite markers as nan/inf."""
    if isinstance(value, dict) and "nonfinite" in value:
        return str(value["nonfinite"])
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return "" if value is None else str(value)


def junit_xml(data: dict[str, Any]) -> str:
    """JUnit XML of a report.json mapping.

    Each testcase has a property per metric (``NAME``), its threshold
    (``NAME.threshold``) and golden value (``NAME.golden``), all at full precision;
    consequential failures carry ``consequence_of``.
    """
    checks = data["checks"]
    suite = ET.Element(
        "testsuite",
        name=f"paritygate.{data['name']}",
        tests=str(len(checks)),
        failures=str(sum(c["status"] == "fail" for c in checks)),
        errors=str(sum(c["status"] == "error" for c in checks)),
        skipped=str(sum(c["status"] == "skip" for c in checks)),
        time=f"{sum(c.get('duration_s', 0.0) for c in checks):.3f}",
    )
    for c in checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"paritygate.{data['name']}",
            name=c["id"],
            time=f"{c.get('duration_s', 0.0):.3f}",
        )
        props = ET.SubElement(case, "properties")
        golden = c.get("golden") or {}
        thresholds = c.get("thresholds") or {}
        for name, value in c["metrics"].items():
            ET.SubElement(props, "property", name=name, value=_full(value))
            if name in thresholds:
                ET.SubElement(props, "property", name=f"{name}.threshold",
                              value=_full(thresholds[name]))
            if name in golden:
                ET.SubElement(props, "property", name=f"{name}.golden", value=_full(golden[name]))
        if c.get("consequence_of"):
            ET.SubElement(props, "property", name="consequence_of", value=c["consequence_of"])
        if c["status"] in ("fail", "error"):
            tag = "failure" if c["status"] == "fail" else "error"
            el = ET.SubElement(case, tag, message=c["message"][:1000])
            el.text = c["message"]
        elif c["status"] == "skip":
            ET.SubElement(case, "skipped", message=c["message"])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
