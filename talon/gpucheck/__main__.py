"""``python -m talon.gpucheck``: the GPU check (``talon.gpucheck.check``)."""

from talon.gpucheck.check import main

raise SystemExit(main())
