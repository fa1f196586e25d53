"""Structured output on SGLang (`tests/support/structured.py`), the twin of `tests/vllm/test_vllm_structured_output.py`.

Verifying modes: 20 JSON-schema and 20 regex requests on the real model (SmolLM2-135M-Instruct, float32), each
mode's output valid under its constraint and equal to SGLang's own AR under the same constraint (tie-aware, on the
grammar-masked margins). Our verify worker masks each chain row with the request's grammar after the drafts before
it (`common.grammar`); SGLang's scheduler advances the grammar over what a step commits.

Committing modes: each decoder applies the constraint with its own copy of SGLang's grammar object
(`sglang_plugin.commit.own_grammar`), so the output equals the reference runner's under the same constraint and is
valid: `wedlm` on its trained tiny checkpoint in CI, `diffusion` a sweep.

Runs in the SGLang environment (see `tests/sglang/test_sglang_server.py`)."""

import json

import pytest
import sglang

from scripts.sglang_server import CPU_KWARGS
from scripts.trained_models import SHIPPED
from tests.support import structured

METHODS = {
    "jacobi": ("jacobi", {"block_size": 8, "adaptive": False}),
    "diffusion_self": ("diffusion_self", {"num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                                          "adaptive": False}),
    # Committing decoders (`own_grammar`), lossless: equal to AR under the constraint too.
    "jacobi_recycling": ("jacobi", {"block_size": 8, "pool_size": 4, "adaptive": False}),
    "quadratic": ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3, "draft_adapter": "draft_lora"}),
}
SWEEP = ("diffusion_self", "jacobi_recycling", "quadratic")
COMMITTING = {"wedlm": ("wedlm", {"window": 8}), "diffusion": ("nld", {"block_size": 8})}  # checkpoint, config


def generate(model, mode: str | None, config: dict | None, requests: list) -> tuple[list[tuple[list[int], bool]],
                                                                                     int]:
    """Greedy (token ids, whether it stopped before max_new_tokens) per request, one batch, and the verify steps."""
    decode = {} if mode is None else {"decode_mode": mode, "decode_config": config}
    engine = sglang.Engine(model_path=str(model), **decode, **{**CPU_KWARGS, "dtype": "float32"})
    params = [{"temperature": 0, "max_new_tokens": n,
               **({"json_schema": json.dumps(c["json"])} if "json" in c else {"regex": c["regex"]})}
              for _, c, n in requests]
    try:
        outputs = engine.generate(input_ids=[p for p, _, _ in requests], sampling_params=params)
    finally:
        engine.shutdown()
    got = [(list(o["output_ids"]), o["meta_info"]["finish_reason"]["type"] != "length") for o in outputs]
    return got, sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)


@pytest.fixture(scope="module")
def requests(real_model):
    return structured.requests(real_model)


@pytest.fixture(scope="module")
def ar(real_model, requests, module_engine_env):
    return [tokens for tokens, _ in generate(real_model, None, None, requests)[0]]


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.sweep) if m in SWEEP else m for m in METHODS])
def test_constrained_equals_constrained_ar(real_model, requests, ar, module_engine_env, method):
    got, steps = generate(real_model, *METHODS[method], requests)
    cuts = structured.check(real_model, requests, got, ar, method)
    tokens = sum(len(t) for t, _ in got)
    print(f"{method}: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie, {tokens} tokens in {steps} "
          "verify steps")
    assert tokens > steps + len(got), "no draft accepted: the constrained verify was not exercised"


@pytest.mark.parametrize("mode", ["wedlm", pytest.param("diffusion", marks=pytest.mark.sweep)])
def test_committing_equals_the_constrained_reference(module_engine_env, mode):
    checkpoint, config = COMMITTING[mode]
    path = SHIPPED / checkpoint
    requests = structured.requests(path)
    want, margins = structured.reference(path, {"method": mode, **config}, requests)
    got, _ = generate(path, mode, config, requests)
    cuts = structured.check(path, requests, got, want, mode, margins)
    print(f"{mode}: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie")
