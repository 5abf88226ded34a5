"""``python -m paritygate.report.schemagen [DIR]``: regenerate the published JSON Schemas."""

from __future__ import annotations

import sys
from pathlib import Path

from paritygate.report.model import write_schemas


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for written in write_schemas(Path(args[0] if args else "schemas")):
        print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
