#!/usr/bin/env bash
# The main job: vLLM's OpenAI server on SmolLM2-135M-Instruct, AR and a parallel decoder side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
python -m scripts.serve_demo "$@"
