"""Findings are records: a run's root cause, statuses and links must not depend on wording.

:func:`reworded` returns a run's results with every text a person reads replaced (messages,
causes, fixes and each reason's message); :func:`decisions` is what the verdict and the
root-cause graph decided. The zoo tests assert both are the same for the reworded results.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from paritygate.result import CheckResult
from paritygate.rootcause import explain


def _mask(text: str | None) -> str | None:
    return None if text is None else "reworded " + "x" * (len(text) % 7)


def reworded(results: list[CheckResult]) -> list[CheckResult]:
    """Copies of ``results`` whose every message is reworded (kinds and numbers kept)."""
    return [
        dataclasses.replace(
            r, message=_mask(r.message) or "", cause=_mask(r.cause), fix=_mask(r.fix),
            reasons=[dataclasses.replace(x, message=_mask(x.message) or "") for x in r.reasons],
        )
        for r in results
    ]


def decisions(results: list[CheckResult]) -> dict[str, Any]:
    """Every check's status and ``consequence_of``, and the root cause's check, kind and
    explained checks."""
    explained, root = explain(results)
    return {
        "status": {r.id: r.status for r in explained},
        "consequence_of": {r.id: r.consequence_of for r in explained},
        "root": None if root is None else (root.check, root.kind, root.explains),
    }
