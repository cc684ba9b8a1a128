"""`python -m talon.bench`."""

import sys

from talon.bench.cli import main

sys.exit(main())
