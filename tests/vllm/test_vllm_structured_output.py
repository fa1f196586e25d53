"""Structured output on vLLM (`tests/support/structured.py`).

Lossless methods: 20 JSON-schema and 20 regex requests on the real model (SmolLM2-135M-Instruct, float32), each
method's output valid under its constraint and equal to vLLM's own AR under the same constraint (tie-aware, on the
grammar-masked margins). vLLM masks every verified row and drops the drafts the grammar rejects before they are
forwarded; our proposers see what is left. `jacobi` runs in CI, `diffusion_self` is a sweep.

Committing methods: their decoders apply the constraint (`vllm_plugin.grammars`, `common.grammar`), so the engine's
output equals the reference runner's under the same constraint, and is valid: `wedlm` on its trained tiny checkpoint
in CI; `diffusion` (tiny) and quadratic `diffusion_self` (SmolLM2, where it is lossless: equal to AR) are sweeps."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from parallel_decoding.vllm_plugin.metrics import acceptance
from scripts.trained_models import SHIPPED
from tests.support import structured

METHODS = {
    "jacobi": {"method": "jacobi", "block_size": 8, "adaptive": False},
    "diffusion_self": {"method": "diffusion_self", "num_speculative_tokens": 8, "draft_adapter": "draft_lora",
                       "adaptive": False},
}
ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}
COMMITTING = {"wedlm": ("wedlm", {"method": "wedlm", "window": 8}),
              "diffusion": ("nld", {"method": "diffusion", "block_size": 8})}  # trained tiny checkpoint, config


def generate(model, spec: dict | None, requests: list, stats: list | None = None) -> list[tuple[list[int], bool]]:
    """Greedy (token ids, whether it stopped before max_tokens) per request, every request in one batch."""
    with engine(model, spec, **ENGINE) as llm:
        params = [SamplingParams(temperature=0, max_tokens=n, structured_outputs=StructuredOutputsParams(**c))
                  for _, c, n in requests]
        outputs = llm.generate([{"prompt_token_ids": p} for p, _, _ in requests], params, use_tqdm=False)
        if stats is not None:
            stats.append(acceptance(llm))
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop") for o in outputs]


@pytest.fixture(scope="module")
def requests(real_model):
    return structured.requests(real_model)


@pytest.fixture(scope="module")
def ar(real_model, requests):
    return [tokens for tokens, _ in generate(real_model, None, requests)]


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.sweep) if m == "diffusion_self" else m
                                    for m in METHODS])
def test_constrained_equals_constrained_ar(real_model, requests, ar, method):
    stats = []
    got = generate(real_model, METHODS[method], requests, stats)
    cuts = structured.check(real_model, requests, got, ar, method)
    drafts = stats[0].num_accepted_tokens
    print(f"{method}: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie, {drafts} drafts accepted")
    assert drafts >= 40, "too few drafts accepted for the constrained verify to have been exercised"


@pytest.mark.parametrize("method", ["wedlm", pytest.param("diffusion", marks=pytest.mark.sweep)])
def test_committing_equals_the_constrained_reference(method):
    checkpoint, spec = COMMITTING[method]
    path = SHIPPED / checkpoint
    requests = structured.requests(path)
    want, margins = structured.reference(path, spec, requests)
    cuts = structured.check(path, requests, generate(path, spec, requests), want, method, margins)
    print(f"{method}: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie")


@pytest.mark.sweep
def test_quadratic_equals_constrained_ar(real_model, requests, ar):
    spec = {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3,
            "draft_adapter": "draft_lora"}
    got = generate(real_model, spec, requests)
    cuts = structured.check(real_model, requests, got, ar, "quadratic")
    print(f"quadratic: {sum(c is not None for c in cuts)} of {len(cuts)} cut at a tie")
