import sys

from talon.cli.main import main

sys.exit(main())
