"""Under KV-cache pressure SGLang retracts running requests and prefills them again later; with every mode the
requests still give the tokens they give without pressure (`parallel-decoding generate`'s, greedy and seeded
sampling for the commit modes, greedy for the lossless ones): a request keeps its decoder and generator across a
retraction, and a commit mode's scratch KV is allocated as SGLang allocates its own (evicting cached prefixes), so
the server never runs out of it.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.sglang_server import sglang_server
from tests.support import ties
from tests.support.reference_cli import SEED, reference, settings
from tests.support.sglang_client import PRESSURE_ARGS, PRESSURE_ENV, generate, server_info

MAX_TOKENS = 29
CASES = [
    ({"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02}, (0.0, 1.0)),
    ({"method": "diffusion", "block_size": 4, "confidence_threshold": 0.5}, (0.0, 1.0)),
    ({"method": "jacobi", "block_size": 4}, (0.0,)),
    ({"method": "diffusion_self", "num_speculative_tokens": 4}, (0.0,)),
    ({"method": "jacobi", "block_size": 3, "pool_size": 16, "verification_size": 8}, (0.0, 1.0)),
    # Rows dear: every request held at no draft, most steps SGLang's own with the decoders paused, retracted too.
    ({"method": "jacobi", "block_size": 3, "pool_size": 16, "verification_size": 8, "step_cost": [0.01, 1.0, 1.0]},
     (0.0,)),
]


# In CI: a commit mode (wedlm), the verify worker (diffusion_self) and recycling Jacobi paused and retracted (its
# decoders kept across steps SGLang runs as its own); diffusion, plain Jacobi and recycling Jacobi drafting as sweeps.
SWEPT = {"diffusion", "jacobi", "jacobi-recycling"}
IDS = ["wedlm", "diffusion", "jacobi", "diffusion_self", "jacobi-recycling", "jacobi-recycling-paused"]


@pytest.mark.parametrize(("spec", "temperatures"), [
    pytest.param(*case, id=name, marks=[pytest.mark.sweep] if name in SWEPT else []) for case, name in zip(
        CASES, IDS, strict=True)])
def test_retracted_requests_give_the_reference_tokens(engine_dir, prompts, tmp_path, monkeypatch, spec,
                                                      temperatures):
    for name, value in PRESSURE_ENV.items():
        monkeypatch.setenv(name, value)
    model, log = engine_dir["qwen3"], tmp_path / "server.log"
    references = [reference(model, spec, prompts, tmp_path, t, MAX_TOKENS) for t in temperatures]
    expected = [tokens for tokens_t, _ in references for tokens in tokens_t]
    margins = [m for _, margins_t in references for m in margins_t]
    requests = [(p, t) for t in temperatures for p in prompts]
    with (sglang_server(model, spec["method"], settings(spec), PRESSURE_ARGS, log) as client,
          ThreadPoolExecutor(len(requests)) as pool):
        got = list(pool.map(lambda r: generate(client, r[0], temperature=r[1], sampling_seed=SEED,
                                                max_new_tokens=MAX_TOKENS)["output_ids"],
                            requests))
        planner = server_info(client)["internal_states"][0].get("parallel_decoding_width_planner", {})
    text = log.read_text()
    full = [int(n) for n in re.findall(r"Retract requests\. #retracted_reqs: (\d+)", text)]
    forced = [int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)", text)]
    print(f"{spec['method']}: {sum(full)} requests retracted when the pool was full ({len(full)} times, at most "
          f"{max(full, default=0)} at once), {sum(forced)} more by the test switch")
    assert sum(full) + sum(forced) >= 8  # repeatedly, while many requests run
    if "step_cost" in spec:
        print(f"paused steps: {planner['paused_steps']} of {planner['steps']}, {planner['own_decode_steps']} of "
              "them SGLang's own decode steps")
        assert planner["paused_steps"] >= 0.9 * planner["steps"]
        # Most of those as SGLang's own decode step, its verify slots released and reserved again around them
        # (`sglang_plugin.steady_decode`) while requests are retracted and prefilled again.
        assert planner["own_decode_steps"] >= 0.5 * planner["steps"], planner
    ties.compare(got, expected, margins)
