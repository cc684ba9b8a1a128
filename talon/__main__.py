import sys

from talon.cli import main

sys.exit(main())
