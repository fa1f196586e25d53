"""A short `scripts.stress` run on vLLM's OpenAI server (the minutes-long one is the script): a few hundred
requests from 16 concurrent clients mixing greedy, seeded sampling, stop strings, max_tokens 1..256, streaming and
clients that disconnect mid-stream; every completed answer equals the request's answer alone, and after each round
of load the KV usage, the requests in flight and the plugin's per-request entries are back to zero."""

import pytest

from scripts import stress
from tests.support.stress_report import check


@pytest.mark.sweep  # a load test: a script (`scripts.stress`), run with -m sweep, not in CI's budget
@pytest.mark.parametrize("method", ["wedlm", "diffusion_self"])
def test_short_stress_on_the_vllm_server(tmp_path, method):
    check(stress.run("vllm", method, tmp_path / "models", duration=24, concurrency=16, distinct=12, rounds=2))
