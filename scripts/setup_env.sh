#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with CPU torch and the package in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
