#!/usr/bin/env bash
# Install everything the tests need into ./.venv (and Debian's chromium for the browser test),
# lint the tree (ruff, configured in pyproject.toml), then run the whole suite. A lint error fails
# before any test runs; "no tests ran" (pytest exit 5) is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check --no-compile -r requirements-dev.txt
.venv/bin/python -m ruff check --no-cache .
set +e
# two workers where cores and memory allow, a module a unit of work, the longest first (tests/conftest.py)
.venv/bin/python -m pytest -n auto --dist loadscope --no-loadscope-reorder "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
