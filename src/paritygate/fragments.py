"""What a report renderer returns for one check: the fragments embedded in report.md and
report.html and the files it wrote beside them (see :data:`paritygate.report.RENDERERS`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rendered:
    """Extra report content drawn from a check's records: files written and fragments to embed."""

    markdown: str = ""
    html: str = ""
    files: list[str] = field(default_factory=list)
