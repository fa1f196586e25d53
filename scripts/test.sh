#!/usr/bin/env bash
# The test command: set up both environments, lint, and run the whole suite (SGLang's tests in SGLang's environment).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_sglang_env.sh
. "${VENV:-.venv}/bin/activate"
ruff check .
python -m pytest -q "$@"
PD_REQUIRE_SGLANG=1 "${SGLANG_VENV:-.venv-sglang}/bin/python" -m pytest -q tests/sglang "$@"
