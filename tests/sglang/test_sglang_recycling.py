"""SGLang with `--decode-mode jacobi` and rejection recycling (`pool_size` > 0): pool continuations verified as
branches in the main draft's forward, a winning branch's out-of-place KV recomputed the next step. On a
vocabulary-8 model, where rejected tails recur and branches win often, 32 greedy and 32 seeded sampled requests in
flight give exactly the tokens of `common/`'s Jacobi decoder, the greedy ones those of plain greedy decoding. On a
model whose greedy output walks cycles, the pool lifts tokens per forward well above plain Jacobi's, with the
reference runner's forward count (plus at most one per request). Its width planner decides what is forwarded: with
rows dear every step is a plain AR step (SGLang's own, the decoders paused), with rows free each forwards what
`adaptive: false` does.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import sglang

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts.sglang_server import CPU_ARGS, CPU_KWARGS, sglang_server
from tests.support import ties
from tests.support.exact import MASK
from tests.support.reference_cli import MAX_TOKENS, SEED
from tests.support.sglang_client import generate

SETTINGS = {"block_size": 3, "pool_size": 16, "verification_size": 8}
TEMPERATURES = (0.0, 1.0)


def run(model, method: str, settings: dict | None, prompt: list[int], temperature: float,
        max_tokens: int = MAX_TOKENS):
    """The `common/` decoder's result, sampled as SGLang's `sampling_seed` requests are."""
    config = None if settings is None else parse_config(method, settings)
    sampling = SamplingParams(temperature=temperature, seed=SEED) if temperature else SamplingParams()
    return ReferenceRunner(model).run(make_decoder(method, config, prompt, sampling, Limits(max_tokens)))


def test_recycling_equals_reference(vocab8):
    path, model = vocab8
    rng = random.Random(SEED)
    prompts = [[rng.randrange(MASK) for _ in range(rng.randrange(2, 9))] for _ in range(32)]
    requests = [(p, t) for t in TEMPERATURES for p in prompts]
    expected = [run(model, "jacobi", SETTINGS, p, t) for p, t in requests]
    without_pool = [run(model, "jacobi", {**SETTINGS, "pool_size": 0}, p, t) for p, t in requests]
    assert sum(r.forwards for r in expected) < sum(r.forwards for r in without_pool)  # branches do win here
    ar = [run(model, "ar", None, p, 0.0) for p in prompts]
    ties.compare([r.token_ids for r in expected[: len(prompts)]], [r.token_ids for r in ar], [r.margins for r in ar])
    with (sglang_server(path, "jacobi", json.dumps(SETTINGS), [*CPU_ARGS, "--skip-tokenizer-init"]) as client,
          ThreadPoolExecutor(len(requests)) as pool):
        got = list(pool.map(lambda r: generate(client, r[0], temperature=r[1], sampling_seed=SEED,
                                               ignore_eos=True)["output_ids"], requests))
    ties.compare(got, [r.token_ids for r in expected], [r.margins for r in expected])


def test_recycling_earns_its_forwards(cyclic):
    path, model, prompts = cyclic
    settings = {"block_size": 16, "num_blocks": 2, "spawn_ratio": 0.85, "pool_size": 4, "verification_size": 4,
                "adaptive": False}  # the reference's widths
    expected = [run(model, "jacobi", settings, p, 0.0, 64) for p in prompts]
    plain = [run(model, "jacobi", {**settings, "pool_size": 0}, p, 0.0, 64) for p in prompts]
    ar = [run(model, "ar", None, p, 0.0, 64) for p in prompts]
    assert [r.token_ids for r in expected] == [r.token_ids for r in ar]
    with (sglang_server(path, "jacobi", json.dumps(settings), [*CPU_ARGS, "--skip-tokenizer-init"]) as client,
          ThreadPoolExecutor(len(prompts)) as pool):
        got = list(pool.map(lambda p: generate(client, p, max_new_tokens=64, ignore_eos=True), prompts))
    assert [out["output_ids"] for out in got] == [r.token_ids for r in ar]
    forwards = sum(out["meta_info"]["spec_verify_ct"] + 1 for out in got)  # the prefill gives the first token
    # A winning branch's tokens reach SGLang once a next forward has written their KV in place (its radix cache
    # keeps it): a request whose last commit came from a branch takes one forward more than the reference.
    assert sum(r.forwards for r in expected) <= forwards <= sum(r.forwards for r in expected) + len(prompts)
    tokens = sum(len(r.token_ids) for r in ar)
    assert tokens / forwards >= 1.5 and tokens / forwards >= tokens / sum(r.forwards for r in plain) + 0.4


@pytest.mark.sweep
def test_the_width_planner_decides_what_is_forwarded(cyclic, cpu_engine_env):
    """With rows dear (`step_cost`) every step is a plain AR step, one token each; with rows free every step
    forwards the whole window and its branches, as many steps as `adaptive: false`; AR's tokens every time."""
    path, model, prompts = cyclic
    settings = {"block_size": 8, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4, "verification_size": 4}
    ar = [run(model, "ar", None, p, 0.0, 32).token_ids for p in prompts]
    steps, paused = {}, {}
    for label, extra in {"dear": {"step_cost": [0.01, 1.0, 1.0]}, "free": {"step_cost": [1.0, 0.0, 0.0]},
                         "fixed": {"adaptive": False}}.items():
        engine = sglang.Engine(model_path=str(path), decode_mode="jacobi", decode_config={**settings, **extra},
                               skip_tokenizer_init=True, **CPU_KWARGS)
        try:
            outputs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 32,
                                                                          "ignore_eos": True})
            planner = engine.get_server_info()["internal_states"][0].get("parallel_decoding_width_planner", {})
        finally:
            engine.shutdown()
        assert [out["output_ids"] for out in outputs] == ar, label
        steps[label] = sum(out["meta_info"]["spec_verify_ct"] for out in outputs)
        paused[label] = planner.get("paused_steps", 0)
    assert steps["dear"] == 31 * len(prompts) and steps["free"] == steps["fixed"] < steps["dear"] // 2
    assert paused["dear"] == 31 and paused["free"] == paused["fixed"] == 0  # dear: SGLang's AR steps, decoders paused
