"""Under sampling, vLLM with `jacobi` and `diffusion_self` follows the model's distribution exactly, and the
rejection sampler gets diffusion_self's draft probabilities."""

import pytest
import torch

from tests.support.vllm_engine import engine  # isort: split

from vllm.v1.sample.rejection_sampler import RejectionSampler

from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from parallel_decoding.vllm_plugin import cpu_kernels
from tests.support.exact import MASK, P_VALUE_FLOOR, PARAMS, SAMPLES, VOCAB, chi_square_p_value, exact_joint
from tests.support.vllm_cases import sampled

CASES = [
    {"method": "jacobi", "block_size": 3},
    # Seeded requests follow the width planner under a fixed cost model: widths vary with each request's acceptance.
    {"method": "diffusion_self", "num_speculative_tokens": 2, "step_cost": [1.0, 0.02, 0.2]},
]




def p_value(path, model, spec: dict, params: ReferenceSampling) -> float:
    with engine(path, spec, skip_tokenizer_init=True) as llm:
        outputs = sampled(llm, params, range(SAMPLES))
    counts: dict[tuple[int, ...], int] = {}
    for key in outputs:
        counts[key] = counts.get(key, 0) + 1
    return chi_square_p_value(counts, exact_joint(model, params))


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.8-topp0.8"])
@pytest.mark.parametrize("spec", CASES, ids=[c["method"] for c in CASES])
def test_distribution_matches_model(vocab8, spec, params):
    assert p_value(*vocab8, spec, params) > P_VALUE_FLOOR


def test_broken_sampler_is_detected(vocab8, monkeypatch):
    """Without our CPU `expand_kernel` stand-in, vLLM-CPU's own leaves temperatures unset: the test must see it."""
    monkeypatch.setattr(cpu_kernels, "install", lambda: None)
    assert p_value(*vocab8, CASES[0], PARAMS[0]) < P_VALUE_FLOOR


def test_rejection_sampler_receives_draft_probabilities(vocab8, monkeypatch):
    """Sampled requests hand the sampler q (rows summing to 1, no mass on the mask); greedy ones hand none."""
    seen: list[torch.Tensor | None] = []
    forward = RejectionSampler.forward

    def spy(self, metadata, draft_probs, logits, sampling_metadata):
        if sum(metadata.num_draft_tokens):
            seen.append(None if draft_probs is None else draft_probs.clone())
        return forward(self, metadata, draft_probs, logits, sampling_metadata)

    monkeypatch.setattr(RejectionSampler, "forward", spy)
    path, _ = vocab8
    with engine(path, {**CASES[1], "step_cost": [1.0, 0.0, 0.0]}, skip_tokenizer_init=True) as llm:  # every step drafts
        sampled(llm, PARAMS[0], range(8), max_tokens=8)
        sampled_calls, seen[:] = list(seen), []
        sampled(llm, ReferenceSampling(), range(8), max_tokens=8)
    assert sampled_calls and all(q is not None for q in sampled_calls)
    for q in sampled_calls:
        assert q.dtype == torch.float32 and q.shape[-1] == VOCAB
        torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[0]))
        assert torch.all(q[:, MASK] == 0)
    assert seen and all(q is None for q in seen)
