"""vLLM on the shipped trained checkpoints: `jacobi` (with rejection recycling) on Jacobi Forcing's and `diffusion_self`
on NLD's return vLLM's own greedy output on held-out prompts, and vLLM's acceptance counters are the reference
runner's (so the engine earns the tokens per step the reference measures)."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.vllm_cases import reference_stats, untied
from vllm_plugin.metrics import acceptance

MAX_TOKENS = 48
SERVED = [
    ("jacobi_forcing", {"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear", "adaptive": False}),
    ("nld", {"method": "diffusion_self", "num_speculative_tokens": 7, "adaptive": False}),
]


def generate(model_dir, spec: dict | None, prompts: list[str]):
    """Greedy outputs and acceptance counters of an engine that is gone when this returns."""
    with engine(model_dir, spec) as llm:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        return outputs, acceptance(llm) if spec else None


@pytest.mark.parametrize("checkpoint,spec", SERVED, ids=[c for c, _ in SERVED])
def test_trained_checkpoint_greedy_equals_ar(checkpoint, spec):
    model_dir = SHIPPED / checkpoint
    settings = {k: v for k, v in spec.items() if k != "method"}
    prompts = untied(model_dir, spec["method"], settings, corpus.prompts(16), MAX_TOKENS)
    assert len(prompts) >= 8
    expected, _ = generate(model_dir, None, prompts)
    got, stats = generate(model_dir, spec, prompts)
    ties.compare_greedy(model_dir, [list(w.prompt_token_ids) for w in expected],
                        [list(o.outputs[0].token_ids) for o in got], [list(w.outputs[0].token_ids) for w in expected])
    assert stats == reference_stats(model_dir, spec["method"], settings, prompts, MAX_TOKENS)
    assert stats.num_accepted_tokens / stats.num_drafts > 0.1, stats  # trained drafts are accepted
