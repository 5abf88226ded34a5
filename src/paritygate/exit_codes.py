"""The ``paritygate`` command's exit codes (the CLI's contract; see :mod:`paritygate.cli`)."""

from __future__ import annotations

EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_NOTHING_VERIFIED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
"""Ctrl-C (SIGINT, KeyboardInterrupt) and SIGTERM: no report is written, golden unchanged."""

WORDS = {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_INPUT: "bad input",
         EXIT_NOTHING_VERIFIED: "nothing verified"}
"""Each verdict's exit code as a word."""
