"""Engines' batched digest (`common.row_stats.apply_rows`) equals each decoder digesting its own logits."""

import pytest
import torch

from common.decoder import Limits
from common.diffusion import DiffusionConfig, DiffusionDecoder
from common.quadratic_self_spec import QuadraticSelfSpecConfig, QuadraticSelfSpecDecoder
from common.row_stats import RowReading, RowStats, apply_rows
from common.sampling import SamplingParams
from common.wedlm import WeDLMConfig, WeDLMDecoder

VOCAB, MASK = 12, 11


def decoders(method: str, seeds: list[int | None]) -> list:
    made = []
    for i, seed in enumerate(seeds):
        sampling = SamplingParams() if seed is None else SamplingParams(temperature=0.8, seed=seed)
        limits, prompt = Limits(max_tokens=40 + i, eos_token_ids=(3,)), [1, 2, 4 + i]
        if method == "wedlm":
            made.append(WeDLMDecoder(prompt, sampling, limits, WeDLMConfig(window=6, entropy_threshold=2.0,
                                                                           mask_token_id=MASK)))
        elif method == "quadratic":
            made.append(QuadraticSelfSpecDecoder(prompt, sampling, limits, QuadraticSelfSpecConfig(
                block_size=3, mask_token_id=MASK)))
        else:
            made.append(DiffusionDecoder(prompt, sampling, limits, DiffusionConfig(block_size=5,
                                                                                  confidence_threshold=0.3,
                                                                                  mask_token_id=MASK)))
    return made


def run(method: str, seeds: list[int | None], batched: bool) -> list[list[list[int]]]:
    """Every step's commits, the decoders fed the same random logits (peaked so that some slots fill)."""
    live, generator, steps = decoders(method, seeds), torch.Generator().manual_seed(0), []
    while live := [d for d in live if not d.finished]:
        sizes = [d.next_forward().logit_rows.numel() for d in live]
        logits = torch.randn(sum(sizes), VOCAB, generator=generator) * 4
        outcomes = (apply_rows(live, logits, sizes) if batched
                    else [d.apply(rows) for d, rows in zip(live, logits.split(sizes), strict=True)])
        steps.append([o.committed for o in outcomes])
    return steps


@pytest.mark.parametrize("method", ["wedlm", "diffusion", "quadratic"])
def test_batched_digest_equals_per_request(method: str) -> None:
    seeds = [None, 5, None, None, 7, None]  # greedy requests batched, sampled ones digesting their own logits
    steps = run(method, seeds, batched=True)
    assert steps == run(method, seeds, batched=False)
    assert sum(len(tokens) for step in steps for tokens in step) > len(steps)  # steps that commit several


def test_row_stats_match_their_definitions() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    logits[2, MASK] = 50.0  # the mask's row: excluded, its argmax is the runner-up
    stats = RowStats.of(logits, MASK)
    kept = logits.clone()
    kept[:, MASK] = float("-inf")
    probs = kept.softmax(-1)
    assert torch.equal(stats.token, kept.argmax(-1))
    assert torch.allclose(stats.confidence, probs.max(-1).values)
    top = kept.topk(2).values
    assert torch.allclose(stats.margin, (top[:, 0] - top[:, 1]) / kept.masked_fill(kept.isinf(), 0).abs().amax(-1))
    raw = RowStats.of(logits)
    assert torch.allclose(raw.entropy, -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1))
    assert RowReading().excluded is None
    host = stats.host()
    assert torch.equal(host.token, stats.token) and torch.equal(host.margin, stats.margin)
