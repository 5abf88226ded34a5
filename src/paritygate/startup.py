"""When this process imported paritygate: the gate's start-up time is measured from here.

Its own module (imported first by the package) so that the gate can read it without
importing the package root, which lists the gate among its exports.
"""

from __future__ import annotations

import time

IMPORTED_AT = time.perf_counter()
"""``time.perf_counter()`` when ``paritygate`` was first imported in this process."""
