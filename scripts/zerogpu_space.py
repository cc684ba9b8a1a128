"""Write a copy of this repository that a ZeroGPU Space can run.

    python -m scripts.zerogpu_space OUT_DIR      # then push OUT_DIR to the Space

ZeroGPU supports only some Python and torch versions (``talon.models.zerogpu``), and this repository's
own pins are those of the two README commands (Python 3.11, torch 2.13.0). The copy differs in
three places only: ``requirements.txt`` pins ZeroGPU's torch and adds ``spaces``, and the README's
front matter sets ZeroGPU's Python and hardware. Files come from ``git ls-files`` (tracked files,
as a push would send them).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from talon.models.zerogpu import SPACE_PYTHON, SPACE_TORCH

REPO = Path(__file__).resolve().parents[1]

SPACES_PIN = "spaces==0.51.3"  # the version whose ZeroGPU contract talon.models.zerogpu follows


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True, text=True)
    return [name for name in out.stdout.split("\0") if name]


def zerogpu_requirements(text: str) -> str:
    text = re.sub(r"^torch==\S+", f"torch=={SPACE_TORCH}", text, count=1, flags=re.MULTILINE)
    return f"{text.rstrip()}\n# ZeroGPU: its decorator and torch patching\n{SPACES_PIN}\n"


def zerogpu_front_matter(readme: str) -> str:
    readme = re.sub(r'^python_version: .*$', f'python_version: "{SPACE_PYTHON}"', readme, count=1, flags=re.MULTILINE)
    return re.sub(r"^suggested_hardware: .*$", "suggested_hardware: zero-a10g", readme, count=1, flags=re.MULTILINE)


def write_space(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty")
    for name in tracked_files():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    requirements = out / "requirements.txt"
    requirements.write_text(zerogpu_requirements(requirements.read_text(encoding="utf-8")), encoding="utf-8")
    readme = out / "README.md"
    readme.write_text(zerogpu_front_matter(readme.read_text(encoding="utf-8")), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="an empty or new folder for the Space's files")
    args = parser.parse_args(argv)
    write_space(args.out)
    print(f"wrote a ZeroGPU Space to {args.out}: Python {SPACE_PYTHON}, torch {SPACE_TORCH}, {SPACES_PIN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
