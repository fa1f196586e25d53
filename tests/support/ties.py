"""Tie-aware comparison of token sequences computed by differently shaped float32 kernels.

Two computations of the same decoding may break a near-tie (a decision whose margin is a few ulps) differently: a
multi-token window and a one-token step, or the same kernel on a CPU with other instructions. Sequences must be
identical up to the first position where the reference's decision margin (`common.margins`, relative) is below
`TOLERANCE`; they may differ only from there on (the sequence is then *cut* at that tie). A divergence at a
position with a clear margin fails as exact equality would, and so do cuts on more than `MAX_CUT_FRACTION` of the
sequences. Every comparison is counted; the session prints the totals (`conftest.pytest_terminal_summary`).
"""

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from parallel_decoding.common import margins as slack
from parallel_decoding.common.checkpoint import load

TOLERANCE = 1e-4
MAX_CUT_FRACTION = 0.1


@dataclass
class Tally:
    sequences: int = 0
    cut: int = 0


TALLY = Tally()


@cache
def _model(model_dir: str):
    return load(model_dir)[0]


@torch.inference_mode()
def greedy_margins(model, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    """Per generated position, the top-2 margin of greedy AR decoding along `tokens` (one teacher-forced
    float32 forward); `model` is a loaded model or a checkpoint directory."""
    if isinstance(model, (str, Path)):
        model = _model(str(model))
    if not tokens:
        return []
    ids = torch.tensor([list(prompt_ids) + list(tokens[:-1])])
    logits = model(input_ids=ids.to(model.device)).logits[0, len(prompt_ids) - 1 :].float().cpu()
    return [slack.top2(row[None]) for row in logits]


def tie_position(margins: list[float], tolerance: float = TOLERANCE) -> int | None:
    """The first position whose decision margin is below `tolerance` (None: no tie)."""
    return next((i for i, m in enumerate(margins) if m < tolerance), None)


def compare(got: list[list[int]], want: list[list[int]], margins: list[list[float]],
            tolerance: float = TOLERANCE) -> list[int | None]:
    """Assert `got` equals the reference `want` up to each sequence's first tie; return, per sequence, the
    position it was cut at (None: identical, not cut)."""
    assert len(got) == len(want) == len(margins), (len(got), len(want), len(margins))
    cuts: list[int | None] = []
    for i, (g, w, m) in enumerate(zip(got, want, margins, strict=True)):
        g, w = list(g), list(w)
        tie = tie_position(m, tolerance)
        end = len(w) if tie is None else tie
        first = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
        if g == w:
            cuts.append(None)
            continue
        assert first >= end and tie is not None, (
            f"sequence {i} diverges at position {first} (margin {m[first] if first < len(m) else 'n/a'}) before "
            f"any tie (first tie: {tie}):\n got {g}\nwant {w}")
        cuts.append(tie)
    TALLY.sequences += len(cuts)
    cut = sum(c is not None for c in cuts)
    TALLY.cut += cut
    assert cut <= MAX_CUT_FRACTION * len(cuts), f"{cut} of {len(cuts)} sequences cut at a tie: too many to trust"
    return cuts


def compare_greedy(model, prompt_ids: list[list[int]], got: list[list[int]], want: list[list[int]]
                   ) -> list[int | None]:
    """`compare` for lossless greedy decoding: margins of greedy AR along the reference `want`."""
    margins = [greedy_margins(model, p, w) for p, w in zip(prompt_ids, want, strict=True)]
    return compare(got, want, margins)


LOSSLESS = {"ar", "jacobi", "diffusion_self", "diffusion_self_quadratic"}


def reference_ties(model_dir, method: str, settings: dict, prompts: list[str], max_tokens: int) -> list[int | None]:
    """Per prompt, the first near-tied decision of the reference runner's greedy decoding (None: none): greedy
    AR's for the lossless methods (their output is greedy AR's), the method's own for the others."""
    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.methods import make_decoder, parse_config
    from parallel_decoding.common.runner import ReferenceRunner
    from parallel_decoding.common.sampling import SamplingParams

    if method == "huginn":
        return huginn_ties(model_dir, settings, prompts, max_tokens)
    model, tokenizer = load(model_dir)
    method = "ar" if method in LOSSLESS else method
    config = parse_config(method, {} if method == "ar" else settings, mask_token_id=model.config.mask_token_id)
    runner = ReferenceRunner(model)
    return [tie_position(runner.run(make_decoder(method, config, tokenizer.encode(p), SamplingParams(),
                                                 Limits(max_tokens))).margins) for p in prompts]


def huginn_ties(model_dir, settings: dict, prompts: list[str], max_tokens: int) -> list[int | None]:
    """`reference_ties` of a Huginn sampler on a Raven checkpoint: its argmaxes' and exit tests' slacks."""
    from transformers import AutoTokenizer

    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.huginn.config import HuginnConfig
    from parallel_decoding.common.huginn.reference import generate
    from parallel_decoding.common.models.raven import RavenForCausalLM

    model, tokenizer = RavenForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    limits = Limits(max_tokens, eos_token_ids=(tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    return [tie_position(generate(model, tokenizer.encode(p), HuginnConfig(**settings), limits=limits).margins)
            for p in prompts]


def untied_references(model_dir, method: str, settings: dict, prompts: list[str], max_tokens: int
                      ) -> tuple[list[str], list, list[list[int]]]:
    """The prompts whose reference greedy decoding (the method's own, on `model_dir`) takes no near-tied decision,
    with those decoders (their acceptance counters) and tokens."""
    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.methods import make_decoder, parse_config
    from parallel_decoding.common.runner import ReferenceRunner
    from parallel_decoding.common.sampling import SamplingParams

    model, tokenizer = load(model_dir)
    config = parse_config(method, settings, mask_token_id=tokenizer.mask_token_id)
    runner = ReferenceRunner(model)
    kept, decoders, tokens = [], [], []
    for prompt in prompts:
        decoder = make_decoder(method, config, tokenizer.encode(prompt), SamplingParams(), Limits(max_tokens))
        result = runner.run(decoder)
        if tie_position(result.margins) is None:
            kept.append(prompt)
            decoders.append(decoder)
            tokens.append(result.token_ids)
    return kept, decoders, tokens


def compare_untied(got: list, want: list, tied: list[bool]) -> None:
    """Results that cannot be cut token by token (texts, counts): equal where the reference took no near-tied
    decision; the others are counted as cut."""
    assert len(got) == len(want) == len(tied)
    for i, (g, w, t) in enumerate(zip(got, want, tied, strict=True)):
        assert t or g == w, f"result {i} differs without a tie:\n got {g}\nwant {w}"
    cut = sum(t and g != w for g, w, t in zip(got, want, tied, strict=True))
    TALLY.sequences += len(got)
    TALLY.cut += cut
    assert cut <= MAX_CUT_FRACTION * len(got), f"{cut} of {len(got)} results cut at a tie: too many to trust"
