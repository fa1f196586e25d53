"""For every method, the KV-cached path equals a from-scratch recompute, and committed KV equals a fresh prefill."""

import pytest
import torch
from transformers import DynamicCache

from parallel_decoding.common.attention import additive_mask
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import after_rows
from tests.support import ties

MAX_TOKENS = 27
METHODS = [
    ("ar", {}),
    ("jacobi", {"block_size": 5}),
    ("jacobi", {"block_size": 4, "num_blocks": 3, "spawn_ratio": 0.5, "pool_size": 4, "verification_size": 3}),
    ("jacobi", {"block_size": 4, "pool_size": 4, "recycling": "linear"}),
    ("diffusion_self", {"num_speculative_tokens": 6}),
    ("diffusion_self_quadratic", {"block_size": 5}),
    ("diffusion", {"block_size": 8, "confidence_threshold": 0.9}),
    ("diffusion", {"block_size": 5, "confidence_threshold": 0.3}),
    ("wedlm", {"window": 8, "entropy_threshold": 0.4, "distance_penalty": 0.02}),
    ("wedlm", {"window": 4, "entropy_threshold": 3.0, "distance_penalty": 0.1}),
    ("wedlm", {"window": 6, "entropy_threshold": None}),
    ("wedlm_spec", {"window": 6}),
]
SAMPLING = [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9, seed=11)]
IDS = [f"{m}-{s}" for m, s in METHODS]


def run(model, method, settings, ids, sampling, use_cache):
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    decoder = make_decoder(method, config, ids, sampling, Limits(MAX_TOKENS))
    return ReferenceRunner(model, use_cache=use_cache).run(decoder)


@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "sampled"])
@pytest.mark.parametrize(("method", "settings"), METHODS, ids=IDS)
def test_cached_equals_recompute(tiny, prompts, method, settings, sampling):
    model, tokenizer = tiny
    cached, recomputed = [], []
    for prompt in prompts[:8]:
        ids = tokenizer.encode(prompt)
        cached.append(run(model, method, settings, ids, sampling, use_cache=True))
        recomputed.append(run(model, method, settings, ids, sampling, use_cache=False))
    cuts = ties.compare([r.token_ids for r in recomputed], [c.token_ids for c in cached], [c.margins for c in cached])
    assert [c.forwards for c, cut in zip(cached, cuts, strict=True) if cut is None] == [
        r.forwards for r, cut in zip(recomputed, cuts, strict=True) if cut is None]


@torch.inference_mode()
def fresh_prefill(model, tokens: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True)
    return cache


@pytest.mark.parametrize(("method", "settings"), METHODS, ids=IDS)
def test_committed_kv_equals_fresh_prefill(qwen3, prompts, method, settings):
    """After every forward the kept cache is exactly the causal prefill of the committed prefix."""
    model, tokenizer = qwen3
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    for prompt in prompts[:4]:
        decoder = make_decoder(method, config, tokenizer.encode(prompt), SamplingParams(), Limits(MAX_TOKENS))
        for step in ReferenceRunner(model).steps(decoder):
            cache = step.cache
            assert cache.get_seq_length() == decoder.cache_len
            fresh = fresh_prefill(model, decoder.tokens[: decoder.cache_len])
            for kept, expected in zip(cache.layers, fresh.layers, strict=True):
                torch.testing.assert_close(kept.keys, expected.keys, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(kept.values, expected.values, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "sampled"])
@pytest.mark.parametrize(("method", "settings"), METHODS, ids=IDS)
def test_lagging_cache_with_recomputed_rows_equals_reference(qwen3, prompts, method, settings, sampling):
    """An engine whose cache holds fewer tokens than the decoder counts as cached (SGLang's, after scratch
    windows) forwards the missing ones first (`after_rows`) and decodes exactly what the reference decodes."""
    model, tokenizer = qwen3
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    got, expected = [], []
    for prompt in prompts[:4]:
        ids = tokenizer.encode(prompt)
        expected.append(ReferenceRunner(model).run(make_decoder(method, config, ids, sampling, Limits(MAX_TOKENS))))
        decoder = make_decoder(method, config, ids, sampling, Limits(MAX_TOKENS))
        cache, pooled = DynamicCache(config=model.config), 0
        while not decoder.finished:
            window = after_rows(decoder.next_forward(), decoder.tokens[pooled : decoder.cache_len], pooled)
            out = model(input_ids=window.token_ids[None], position_ids=window.positions[None], past_key_values=cache,
                        attention_mask=additive_mask(window, pooled, model.dtype), use_cache=True)
            decoder.apply(out.logits[0, window.logit_rows].float())
            pooled = max(len(ids), decoder.cache_len - decoder.forwards % 3)
            cache.crop(pooled)
        got.append(decoder.output)
    ties.compare(got, [e.token_ids for e in expected], [e.margins for e in expected])
