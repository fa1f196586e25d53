"""The top-k, top-p and min-p cuts (`common.sampling.target_probs`) as each engine makes them: vLLM's top-p over the
distribution renormalised after top-k, SGLang's over the whole distribution; min-p the same in both."""

import math

import pytest
import torch

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.sampling import SamplingParams, target_probs

LOGITS = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()


def probs(**params) -> list[float]:
    return [round(p, 6) for p in target_probs(LOGITS, SamplingParams(temperature=1.0, **params))[0].tolist()]


def test_top_p_after_top_k_is_each_engines():
    """Top 3, then top-p 0.75: vLLM's cumulative mass renormalised over the top 3 (0, .44, .78) drops the third token,
    SGLang's over the whole distribution (0, .4, .7) keeps it."""
    assert probs(top_k=3, top_p=0.75) == [round(4 / 7, 6), round(3 / 7, 6), 0.0, 0.0]
    assert probs(top_k=3, top_p=0.75, rules="sglang") == [round(p / 0.9, 6) for p in (0.4, 0.3, 0.2)] + [0.0]


@pytest.mark.parametrize("rules", ["vllm", "sglang"])
def test_min_p_keeps_what_is_likely_enough_beside_the_most_likely(rules):
    assert probs(min_p=0.6, rules=rules) == [round(4 / 7, 6), round(3 / 7, 6), 0.0, 0.0]  # >= 0.24
    assert math.isclose(sum(probs(min_p=0.2, top_p=0.95, rules=rules)), 1.0, abs_tol=1e-5)


def test_bad_values_are_refused_by_name():
    with pytest.raises(ConfigError, match="min_p"):
        SamplingParams(min_p=1.5)
    with pytest.raises(ConfigError, match="rules"):
        SamplingParams(rules="tgi")
