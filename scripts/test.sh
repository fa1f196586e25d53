#!/usr/bin/env bash
# The test command: set up both environments, lint, and run the whole suite (SGLang's tests in SGLang's environment).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_sglang_env.sh
. "${VENV:-.venv}/bin/activate"
ruff check .
python -m pytest -q "$@"
PD_REQUIRE_SGLANG=1 "${SGLANG_VENV:-.venv-sglang}/bin/python" -m pytest -q tests/test_sglang_server.py tests/test_sglang_commit_modes.py tests/test_sglang_engine.py tests/test_sglang_checkpoints.py tests/test_sglang_sampling.py tests/test_sglang_retraction.py tests/test_sglang_recycling.py tests/test_sglang_stress.py tests/test_sglang_huginn.py tests/test_sglang_draft_adapter.py tests/test_sglang_wedlm_spec.py tests/test_sglang_logprobs.py tests/test_sglang_smollm2.py "$@"
