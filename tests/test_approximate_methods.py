"""WeDLM and block diffusion equal an independent from-scratch implementation of the papers' algorithms."""

import pytest

from common.decoder import Limits
from common.methods import make_decoder, parse_config
from common.runner import ReferenceRunner
from common.sampling import SamplingParams
from tests import naive_algorithms

MAX_TOKENS = 23
WEDLM = [(8, 0.4, 0.02), (4, 5.0, 0.1), (16, 7.0, 0.0), (6, None, 0.0)]
FILLS_ALL = 7.0  # above log(vocab): every mask is filled each step
DIFFUSION = [(8, 0.9), (5, 0.2), (32, 0.05)]


def decode(model, method, settings, ids, eos=()):
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    decoder = make_decoder(method, config, ids, SamplingParams(), Limits(MAX_TOKENS, eos))
    result = ReferenceRunner(model).run(decoder)
    return result.token_ids, result


@pytest.mark.parametrize(("window", "tau", "lam"), WEDLM)
def test_wedlm_equals_naive(tiny, prompts, window, tau, lam):
    model, tokenizer = tiny
    parallel_steps = 0
    for prompt in prompts[:12]:
        ids = tokenizer.encode(prompt)
        settings = {"window": window, "entropy_threshold": tau, "distance_penalty": lam}
        got, result = decode(model, "wedlm", settings, ids)
        mask = model.config.mask_token_id
        assert got == naive_algorithms.wedlm(model, ids, mask, window, tau, lam, MAX_TOKENS)
        eos = (got[7],)
        assert decode(model, "wedlm", settings, ids, eos)[0] == naive_algorithms.wedlm(
            model, ids, mask, window, tau, lam, MAX_TOKENS, eos
        )
        parallel_steps += result.tokens_per_forward > 1
    if tau == FILLS_ALL:
        assert parallel_steps == 12


@pytest.mark.parametrize("dlm_type", ["llada", "dream"])
@pytest.mark.parametrize(("block", "tau"), DIFFUSION)
def test_block_diffusion_equals_naive(tiny, prompts, block, tau, dlm_type):
    model, tokenizer = tiny
    for prompt in prompts[:12]:
        ids = tokenizer.encode(prompt)
        settings = {"block_size": block, "confidence_threshold": tau, "dlm_type": dlm_type}
        got, _ = decode(model, "diffusion", settings, ids)
        mask = model.config.mask_token_id
        shifted = dlm_type == "dream"
        assert got == naive_algorithms.block_diffusion(model, ids, mask, block, tau, MAX_TOKENS, shifted=shifted)
        eos = (got[6],)
        assert decode(model, "diffusion", settings, ids, eos)[0] == naive_algorithms.block_diffusion(
            model, ids, mask, block, tau, MAX_TOKENS, eos, shifted=shifted
        )
