#!/usr/bin/env bash
# Regenerates data/eagle3_parity/: an EAGLE-3 head built, saved and run by a reference
# implementation (the speculators library's Eagle3DraftModel, the head vLLM serves), which
# tests/test_eagle3_parity.py compares Talon's head with. speculators pins transformers<=5.19 and
# brings training dependencies, so it gets its own virtual environment (EAGLE3_PARITY_VENV,
# default ~/.cache/talon/speculators-venv). Not part of the test run; seconds once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EAGLE3_PARITY_VENV:-$HOME/.cache/talon/speculators-venv}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import speculators.models.eagle3" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 "transformers==5.19.0" pydantic \
    pydantic-settings loguru safetensors huggingface-hub "numpy<2.5" rich typer click tqdm psutil protobuf openai \
    datasets pandas python-dateutil hs-connectors==0.9.0
  # its torchvision and torchaudio requirements are for training data, not the head: left out
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps speculators==0.9.0
fi
"$VENV/bin/python" scripts/eagle3_parity.py data/eagle3_parity
rm -f data/eagle3_parity/*/config.py  # the library's own config class, which Talon does not run
