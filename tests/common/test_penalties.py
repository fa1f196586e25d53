"""Penalties, logit bias and allowed tokens (`common.penalties`): each logit row's history computed by hand; the
adjustment against vLLM's formulas and SGLang's; AR under a repetition penalty equal to transformers' own; every
lossless method equal to AR under the same settings; and the committing methods changed by them where they bite."""

import pytest
import torch

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.penalties import adjusted, fills
from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import Attention, Forward
from scripts.trained_models import SHIPPED
from tests.support import ties

MAX_TOKENS = 24
# Mild enough that the trained checkpoints still accept drafts under it.
MILD = SamplingParams(presence_penalty=0.2, frequency_penalty=0.1, repetition_penalty=1.15, logit_bias=((5, 0.5),))
PENALISED = SamplingParams(presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.6,
                           logit_bias=((5, 1.5), (7, -2.0)))


def test_each_row_counts_the_tokens_it_sees_before_it():
    """Committed: 3 tokens. Rows at logical positions 2 (recomputed, committed), 3, 5 (fills), 4 and 6 (masks,
    token 9); the rows see each other per the mask. A row's history: what it sees at positions 3.. up to its own,
    masks left out."""
    visible = torch.tensor([[1, 0, 0, 0, 0],
                            [1, 1, 0, 0, 0],
                            [1, 1, 1, 1, 1],
                            [1, 1, 1, 1, 0],
                            [1, 0, 1, 1, 1]], dtype=torch.bool)
    forward = Forward(torch.tensor([1, 4, 6, 9, 9]), torch.tensor([2, 3, 5, 4, 6]), torch.tensor([0, 1, 2, 3, 4]),
                      Attention.CUSTOM, visible)
    assert fills(forward, committed=3, mask_token_id=9).int().tolist() == [
        [0, 0, 0, 0, 0],  # position 2: committed
        [0, 1, 0, 0, 0],  # position 3: itself
        [0, 1, 1, 0, 0],  # position 5: 3 and itself (the mask at 4 left out)
        [0, 1, 0, 0, 0],  # position 4: 3 (5 is after it)
        [0, 0, 1, 0, 0],  # position 6: 5 (it does not see 3)
    ]


def test_adjustment_follows_vllms_formulas():
    """Vocabulary 6, prompt [0], output [1, 1], one causal row over a fill of token 2: allowed tokens, bias, then
    repetition (prompt and generated), frequency (2 for token 1) and presence."""
    forward = Forward(torch.tensor([1, 2]), torch.tensor([2, 3]), torch.tensor([1]))
    logits = torch.tensor([[2.0, -1.0, 4.0, 1.0, 3.0, 0.5]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0,
                            logit_bias=((3, 1.0),), allowed_token_ids=(0, 1, 2, 3))
    got = adjusted(logits, params, prompt=[0], output=[1, 1], forward=forward)
    want = [2.0 / 2, -1.0 * 2 - 0.25 * 2 - 0.5, 4.0 / 2 - 0.25 - 0.5, 1.0 + 1.0, float("-inf"), float("-inf")]
    assert got.tolist() == [want]


def test_adjustment_follows_sglangs_formulas():
    """The same case by SGLang's definitions: frequency and presence subtracted first, then repetition over the
    generated tokens only (token 0, in the prompt alone, untouched), then the bias, which the penalty does not scale."""
    forward = Forward(torch.tensor([1, 2]), torch.tensor([2, 3]), torch.tensor([1]))
    logits = torch.tensor([[2.0, -1.0, 4.0, 1.0, 3.0, 0.5]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0,
                            logit_bias=((2, 1.0),), allowed_token_ids=(0, 1, 2, 3), rules="sglang")
    got = adjusted(logits, params, prompt=[0], output=[1, 1], forward=forward)
    want = [2.0, (-1.0 - 0.25 * 2 - 0.5) * 2, (4.0 - 0.25 - 0.5) / 2 + 1.0, 1.0, float("-inf"), float("-inf")]
    assert got.tolist() == [want]


@pytest.fixture(scope="module")
def llama(tiny_dir):
    return load(tiny_dir / "llama")


def ar(model, ids: list[int], sampling: SamplingParams) -> tuple[list[int], list[float]]:
    result = ReferenceRunner(model).run(make_decoder("ar", None, ids, sampling, Limits(MAX_TOKENS)))
    return result.token_ids, result.margins


def test_ar_repetition_penalty_equals_transformers(llama, prompts):
    model, tokenizer = llama
    got, want, margins = [], [], []
    for prompt in prompts[:6]:
        ids = tokenizer.encode(prompt)
        tokens, slack = ar(model, ids, SamplingParams(repetition_penalty=1.8))
        out = model.generate(torch.tensor([ids]), do_sample=False, repetition_penalty=1.8, max_new_tokens=MAX_TOKENS,
                             min_new_tokens=MAX_TOKENS, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        got.append(tokens)
        want.append(out[0, len(ids):].tolist())
        margins.append(slack)
    ties.compare(got, want, margins)
    assert got != [ar(model, tokenizer.encode(p), SamplingParams())[0] for p in prompts[:6]]  # the penalty bites


@pytest.mark.parametrize(("method", "checkpoint", "settings"), [
    ("jacobi", "jacobi_forcing", {"block_size": 6, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4,
                                  "verification_size": 2}),
    ("diffusion_self", "nld", {"num_speculative_tokens": 5}),
    ("diffusion_self", "nld", {"num_speculative_tokens": 3, "mode": "quadratic"}),
    ("wedlm_spec", "wedlm", {"window": 6}),
], ids=["jacobi-recycling", "diffusion_self", "quadratic", "wedlm_spec"])
def test_lossless_methods_equal_penalised_ar(prompts, method, checkpoint, settings):
    """On the checkpoint trained for each, where steps accept drafts: a verify row past the first draft is
    penalised for the drafts before it, as AR's row is for the tokens it committed."""
    setup = reference_setup(SHIPPED / checkpoint, method, settings)
    got, want, margins, accepted = [], [], [], 0
    for prompt in prompts[:8]:
        ids = setup.tokenizer.encode(prompt)
        tokens, slack = ar(setup.model, ids, MILD)
        decoder = setup.decoder(ids, MILD, Limits(MAX_TOKENS))
        got.append(setup.runner.run(decoder).token_ids)
        want.append(tokens)
        margins.append(slack)
        accepted += decoder.acceptance.num_accepted_tokens
    ties.compare(got, want, margins)
    assert accepted >= 12, accepted  # the drafts' histories mattered


@pytest.mark.parametrize(("method", "settings"), [
    ("wedlm", {"window": 6, "entropy_threshold": 2.0}),
    ("diffusion", {"block_size": 6, "confidence_threshold": 0.2}),
])
def test_committing_methods_apply_them(llama, prompts, method, settings):
    """The settings change what a committing method commits, the same with the KV cache as recomputed."""
    model, tokenizer = llama
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    outputs = {}
    for name, sampling, cache in (("plain", SamplingParams(), True), ("penalised", PENALISED, True),
                                  ("recomputed", PENALISED, False)):
        outputs[name] = [ReferenceRunner(model, use_cache=cache).run(
            make_decoder(method, config, tokenizer.encode(p), sampling, Limits(MAX_TOKENS))).token_ids
            for p in prompts[:6]]
    assert outputs["penalised"] != outputs["plain"]
    assert outputs["penalised"] == outputs["recomputed"]


@pytest.mark.parametrize(("method", "settings"), [
    ("ar", None),
    ("wedlm", {"window": 6, "entropy_threshold": 2.0}),
    ("diffusion", {"block_size": 6, "confidence_threshold": 0.2}),
    ("diffusion_self", {"num_speculative_tokens": 3, "mode": "quadratic"}),
])
def test_min_tokens_hold_back_the_stop_tokens(llama, prompts, method, settings):
    """A stop token the output reaches at its third token ends it there; with `min_tokens` 8 no row predicting one
    of the first 8 tokens chooses it (each row's predicted position), and quadratic's output is AR's under it."""
    model, tokenizer = llama
    config = None if settings is None else parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model)

    def run(ids, sampling, limits):
        return runner.run(make_decoder(method, config, ids, sampling, limits)).token_ids

    for prompt in prompts[:4]:
        ids = tokenizer.encode(prompt)
        stop = run(ids, SamplingParams(), Limits(MAX_TOKENS))[2]
        limits = Limits(MAX_TOKENS, eos_token_ids=(stop,))
        assert len(run(ids, SamplingParams(), limits)) <= 3
        held = SamplingParams(min_tokens=8, stop_token_ids=(stop,))
        tokens = run(ids, held, limits)
        assert len(tokens) >= 8 and stop not in tokens[:8], tokens
        if method == "diffusion_self":
            assert tokens == ar(model, ids, held)[0][: len(tokens)]
