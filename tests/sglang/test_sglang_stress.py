"""`tests/vllm/test_stress.py` on SGLang's server (`--decode-mode`): no request differs from its answer alone, nothing
stays behind after each round of load. Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""


import pytest

from scripts import stress
from tests.support.stress_report import check


@pytest.mark.sweep  # a load test: a script (`scripts.stress`), run with -m sweep, not in CI's budget
@pytest.mark.parametrize("method", ["wedlm", "jacobi"])
def test_short_stress_on_the_sglang_server(tmp_path, method):
    check(stress.run("sglang", method, tmp_path / "models", duration=24, concurrency=16, distinct=12, rounds=2))
