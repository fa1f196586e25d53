#!/usr/bin/env bash
# The test command: set up the environment, lint, and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
ruff check .
python -m pytest -q "$@"
