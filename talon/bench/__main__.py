"""`python -m talon.bench`."""

import sys

from talon.cli.bench import main

sys.exit(main())
