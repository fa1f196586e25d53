#!/usr/bin/env bash
# The test command: set up both environments, lint, and run the whole suite in three parts side by side (SGLang's
# tests in SGLang's environment, the vLLM tests, and the rest), so a CI machine's two cores stay busy to the end
# (engine start-ups and servers mostly wait); the other parts' output follows the first's, from their logs.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
SGLANG_LOG=out/sglang-tests.log
VLLM_LOG=out/vllm-tests.log
( bash scripts/setup_sglang_env.sh \
  && PD_REQUIRE_SGLANG=1 "${SGLANG_VENV:-.venv-sglang}/bin/python" -m pytest -q --durations=20 tests/sglang "$@" ) \
  >"$SGLANG_LOG" 2>&1 &
sglang=$!
trap 'pkill -P $sglang 2>/dev/null; kill $sglang 2>/dev/null; pkill -P ${vllm:-0} 2>/dev/null; kill ${vllm:-0} 2>/dev/null
      true' EXIT
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
python -m pytest -q --durations=20 tests/vllm "$@" >"$VLLM_LOG" 2>&1 &
vllm=$!
main=0
ruff check . && python -m pytest -q --durations=20 --ignore=tests/vllm --ignore=tests/sglang "$@" || main=$?
vllm_rc=0
wait $vllm || vllm_rc=$?
sglang_rc=0
wait $sglang || sglang_rc=$?
trap - EXIT
echo "== vLLM's tests ($VLLM_LOG) =="
cat "$VLLM_LOG"
echo "== SGLang's suite ($SGLANG_LOG) =="
cat "$SGLANG_LOG"
[ "$main" -eq 0 ] && [ "$vllm_rc" -eq 0 ] && [ "$sglang_rc" -eq 0 ]
