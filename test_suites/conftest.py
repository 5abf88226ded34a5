"""Suite-wide: every report.json the tests write (in this process and in the CLI and pytest
subprocesses they start) is validated against the published schema as it is written."""

from __future__ import annotations

import os

os.environ["PARITYGATE_VALIDATE_REPORTS"] = "1"
