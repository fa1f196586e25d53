"""vLLM with `diffusion_self` in mode `quadratic`: one forward per step (the chain verified causally, the groups'
structured mask applied inside the same forward) returns exactly the tokens of `parallel-decoding generate`,
greedy and sampled, batched; on the shipped trained NLD checkpoint it is greedy AR, accepts the drafts the
reference accepts, and runs one forward per step; its width planner decides the rows forwarded."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.reference_cli import SEED, reference
from tests.support.vllm_cases import planner_decides

SPEC = {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3}
MAX_TOKENS = 40


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_equals_reference_cli(engine_dir, prompts, tmp_path, temperature):
    expected, margins = reference(engine_dir["qwen3"], SPEC, prompts, tmp_path, temperature)
    params = SamplingParams(temperature=temperature, seed=SEED, max_tokens=len(expected[0]))
    with engine(engine_dir["qwen3"], SPEC) as llm:
        outputs = llm.generate(prompts, params)
    ties.compare([list(o.outputs[0].token_ids) for o in outputs], expected, margins)


def test_trained_nld_greedy_equals_ar_and_accepts_as_the_reference():
    """On held-out prompts whose reference decoding takes no near-tied decision; at the configured width
    (`adaptive: false`) vLLM's counters are the reference's: one step per forward, the reference's accepted drafts.
    The width planner decides what is forwarded: with rows dear (`step_cost`) every step forwards the chain alone
    (no draft at all), with rows free the full width, as pinned; greedy AR's tokens every time."""
    model_dir = SHIPPED / "nld"
    settings = {k: v for k, v in SPEC.items() if k != "method"}
    prompts, reference_decoders, want = ties.untied_references(model_dir, "diffusion_self", settings,
                                                               corpus.prompts(12), MAX_TOKENS)
    assert len(prompts) >= 6
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    fixed = planner_decides(model_dir, SPEC, prompts, params, want)
    assert fixed.num_accepted_tokens == sum(d.acceptance.num_accepted_tokens for d in reference_decoders)
    assert fixed.num_drafts == sum(d.forwards - 1 for d in reference_decoders)  # one forward per step
    assert sum(d.tokens_per_forward for d in reference_decoders) / len(prompts) > 1.2
