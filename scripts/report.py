"""A script's JSON report: printed, and written to ``--out`` when given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(report: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
