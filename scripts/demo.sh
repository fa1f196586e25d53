#!/usr/bin/env bash
# The offline demo: build the tiny local models and decode prompts with every method in the reference runner.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
python -m scripts.demo "$@"
