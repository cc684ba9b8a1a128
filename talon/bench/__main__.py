"""`python -m talon.bench`."""

import sys

from talon.bench.command import main

sys.exit(main())
