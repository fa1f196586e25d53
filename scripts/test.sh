#!/usr/bin/env bash
# The test command: set up both environments, lint, and run the whole suite (SGLang's tests in SGLang's environment).
# The two suites run side by side (each keeps about one core busy, engine start-ups and servers mostly waiting);
# SGLang's output follows the main suite's, from its log.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
SGLANG_LOG=out/sglang-tests.log
( bash scripts/setup_sglang_env.sh \
  && PD_REQUIRE_SGLANG=1 "${SGLANG_VENV:-.venv-sglang}/bin/python" -m pytest -q --durations=20 tests/sglang "$@" ) \
  >"$SGLANG_LOG" 2>&1 &
sglang=$!
trap 'pkill -P $sglang 2>/dev/null; kill $sglang 2>/dev/null || true' EXIT
bash scripts/setup_env.sh
. "${VENV:-.venv}/bin/activate"
main=0
ruff check . && python -m pytest -q --durations=20 "$@" || main=$?
sglang_rc=0
wait $sglang || sglang_rc=$?
trap - EXIT
echo "== SGLang's suite ($SGLANG_LOG) =="
cat "$SGLANG_LOG"
[ "$main" -eq 0 ] && [ "$sglang_rc" -eq 0 ]
