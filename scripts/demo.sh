#!/usr/bin/env bash
# The main job: build the tiny local models and decode prompts with every method.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
python -m scripts.demo "$@"
