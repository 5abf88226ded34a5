"""``python -m paritygate`` runs the command line."""

import sys

from paritygate.cli import main

sys.exit(main())
