#!/usr/bin/env bash
# The main job: a real vLLM server on a tiny local model, answering requests with diffusion self-speculation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
python -m scripts.serve_demo "$@"
