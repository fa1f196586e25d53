"""WeDLM and block diffusion equal an independent from-scratch implementation of the papers' algorithms."""

import pytest

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from tests.support import naive_algorithms, ties

MAX_TOKENS = 23
WEDLM = [(8, 0.4, 0.02), (4, 5.0, 0.1), (16, 7.0, 0.0), (6, None, 0.0)]
FILLS_ALL = 7.0  # above log(vocab): every mask is filled each step
DIFFUSION = [(8, 0.9), (5, 0.2), (32, 0.05)]


def decode(model, method, settings, ids, eos=(), max_tokens=MAX_TOKENS, sampling=None):
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    decoder = make_decoder(method, config, ids, sampling or SamplingParams(), Limits(max_tokens, eos))
    return ReferenceRunner(model).run(decoder)


@pytest.mark.parametrize(("window", "tau", "lam"), WEDLM)
def test_wedlm_equals_naive(tiny, prompts, window, tau, lam):
    model, tokenizer = tiny
    mask = model.config.mask_token_id
    settings = {"window": window, "entropy_threshold": tau, "distance_penalty": lam}
    got, want, margins = [], [], []
    parallel_steps = 0
    for prompt in prompts[:12]:
        ids = tokenizer.encode(prompt)
        result = decode(model, "wedlm", settings, ids)
        eos = (result.token_ids[7],)
        stopped = decode(model, "wedlm", settings, ids, eos)
        got += [naive_algorithms.wedlm(model, ids, mask, window, tau, lam, MAX_TOKENS),
                naive_algorithms.wedlm(model, ids, mask, window, tau, lam, MAX_TOKENS, eos)]
        want += [result.token_ids, stopped.token_ids]
        margins += [result.margins, stopped.margins]
        parallel_steps += result.tokens_per_forward > 1
    ties.compare(got, want, margins)
    if tau == FILLS_ALL:
        assert parallel_steps == 12


@pytest.mark.parametrize("dlm_type", ["llada", "dream"])
@pytest.mark.parametrize(("block", "tau"), DIFFUSION)
def test_block_diffusion_equals_naive(tiny, prompts, block, tau, dlm_type):
    model, tokenizer = tiny
    mask, shifted = model.config.mask_token_id, dlm_type == "dream"
    settings = {"block_size": block, "confidence_threshold": tau, "dlm_type": dlm_type}
    got, want, margins = [], [], []
    for prompt in prompts[:12]:
        ids = tokenizer.encode(prompt)
        result = decode(model, "diffusion", settings, ids)
        eos = (result.token_ids[6],)
        stopped = decode(model, "diffusion", settings, ids, eos)
        got += [naive_algorithms.block_diffusion(model, ids, mask, block, tau, MAX_TOKENS, shifted=shifted),
                naive_algorithms.block_diffusion(model, ids, mask, block, tau, MAX_TOKENS, eos, shifted=shifted)]
        want += [result.token_ids, stopped.token_ids]
        margins += [result.margins, stopped.margins]
    ties.compare(got, want, margins)


PREFIX_CASES = [("wedlm", {"window": 16, "entropy_threshold": 0.4, "distance_penalty": 0.02}, 16),
                ("wedlm", {"window": 8, "entropy_threshold": 2.5, "distance_penalty": 0.1}, 8),
                ("diffusion", {"block_size": 16, "confidence_threshold": 0.5}, 16),
                ("diffusion", {"block_size": 8, "confidence_threshold": 0.1}, 8)]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
@pytest.mark.parametrize(("method", "settings", "width"), PREFIX_CASES, ids=lambda c: str(c))
def test_output_does_not_depend_on_max_tokens(qwen3, prompts, method, settings, width, temperature):
    """The output for max_tokens = n is a prefix of the output for n + 2W (the window or block keeps its width up
    to the end), greedy and seeded; asking for fewer tokens costs no more forwards."""
    model, tokenizer = qwen3
    sampling = SamplingParams(temperature=temperature, seed=11)
    for n in (1, 7, MAX_TOKENS):
        for prompt in prompts[:12]:
            ids = tokenizer.encode(prompt)
            short = decode(model, method, settings, ids, max_tokens=n, sampling=sampling)
            long = decode(model, method, settings, ids, max_tokens=n + 2 * width, sampling=sampling)
            assert short.token_ids == long.token_ids[:n]
            assert short.forwards <= long.forwards
