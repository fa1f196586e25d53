"""Engines' batched digest (`common.row_stats.apply_rows`) equals each decoder digesting its own logits, its
decisions taken once per step for the whole batch."""

import copy

import pytest
import torch

from parallel_decoding.common import diffusion, jacobi, quadratic_self_spec, row_stats, wedlm
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion import DiffusionConfig, DiffusionDecoder
from parallel_decoding.common.jacobi import JacobiConfig, JacobiDecoder
from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecConfig, QuadraticSelfSpecDecoder
from parallel_decoding.common.row_stats import RowReading, RowStats, apply_rows
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.wedlm import WeDLMConfig, WeDLMDecoder

VOCAB, MASK = 12, 11


def decoders(method: str, seeds: list[int | None]) -> list:
    """One decoder per seed (None: greedy), their windows or blocks and thresholds differing within the batch."""
    made = []
    for i, seed in enumerate(seeds):
        sampling = SamplingParams() if seed is None else SamplingParams(temperature=0.8, seed=seed)
        prompt = [1, 2, 4 + i]
        limits = Limits(max_tokens=40 + i, eos_token_ids=(3,), context=len(prompt) + 41 + 2 * i)  # blocks shrink
        if method == "wedlm":
            made.append(WeDLMDecoder(prompt, sampling, limits, WeDLMConfig(
                window=5 + i % 3, entropy_threshold=[2.0, 0.6, None][i % 3], mask_token_id=MASK)))
        elif method == "jacobi":  # plain and multi-block, recycling as branches or linearly, or none
            made.append(JacobiDecoder(prompt, sampling, limits, JacobiConfig(
                block_size=3 + i % 3, num_blocks=1 + i % 2, spawn_ratio=0.5, pool_size=[4, 0, 4][i % 3],
                verification_size=2, recycling=["branches", "linear"][i // 3 % 2])))
        elif method == "quadratic":
            made.append(QuadraticSelfSpecDecoder(prompt, sampling, limits, QuadraticSelfSpecConfig(
                block_size=3, mask_token_id=MASK)))
        else:
            made.append(DiffusionDecoder(prompt, sampling, limits, DiffusionConfig(
                block_size=4 + i % 3, confidence_threshold=[0.9, 0.6, 0.3][i % 3], mask_token_id=MASK)))
    return made


def run(method: str, seeds: list[int | None], batched: bool, margins: bool = True
        ) -> tuple[list[list[list[int]]], list[list[float]]]:
    """Every step's commits and each decoder's decision margins, the decoders fed the same random logits (peaked so
    that some slots fill); batched without `margins` as the engines digest."""
    made = decoders(method, seeds)
    live, generator, steps = made, torch.Generator().manual_seed(0), []
    while live := [d for d in live if not d.finished]:
        if method in ("jacobi", "quadratic"):  # an engine's planner's widths, varying per request and step, 0 too
            for i, d in enumerate(live):
                d.cap((len(steps) + i) % 3)
        sizes = [d.next_forward().logit_rows.numel() for d in live]
        logits = torch.randn(sum(sizes), VOCAB, generator=generator) * 4
        if method == "jacobi":  # a few likely tokens: drafts and recycled branches match now and then
            logits[:, 4:7] += 6
        outcomes = (apply_rows(live, logits, sizes, margins) if batched
                    else [d.apply(rows) for d, rows in zip(live, logits.split(sizes), strict=True)])
        steps.append([o.committed for o in outcomes])
    return steps, [d.decision_margins for d in made]


@pytest.mark.parametrize("method", ["wedlm", "diffusion", "quadratic", "jacobi"])
def test_batched_digest_equals_per_request(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = [None, 5, None, None, 7, None]  # greedy requests batched, sampled ones digesting their own logits
    steps, decided = run(method, seeds, batched=True)
    assert (steps, decided) == run(method, seeds, batched=False)
    lean, unnoted = run(method, seeds, batched=True, margins=False)  # the engines' digest: the same decisions
    assert lean == steps  # without the argmax's slack, only the thresholds' (WeDLM's, diffusion's) are noted
    assert all(u >= m for us, ms in zip(unnoted, decided, strict=True) for u, m in zip(us, ms, strict=True))
    if method in ("quadratic", "jacobi"):  # past the first token (the prefill's, digested per request)
        assert all(m == float("inf") for seed, ms in zip(seeds, unnoted, strict=True) if seed is None for m in ms[1:])
    assert sum(len(tokens) for step in steps for tokens in step) > len(steps)  # steps that commit several
    # The decision runs once per step over the batch's greedy requests.
    module = {"wedlm": wedlm, "diffusion": diffusion, "jacobi": jacobi, "quadratic": quadratic_self_spec}[method]
    rule = {"wedlm": "select_masks", "diffusion": "reveal"}.get(method, "accept_greedy_batch")
    batches, decide = [], getattr(module, rule)

    def counted(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batches.append(len(args[0]))
        return decide(*args)

    monkeypatch.setattr(module, rule, counted)
    run(method, seeds, batched=True)
    if method == "jacobi":  # the greedy match takes every option (drafts, branches) of every greedy request
        assert max(batches) >= sum(seed is None for seed in seeds) > 1 + 2  # a sampled request's options
    else:
        assert max(batches) == sum(seed is None for seed in seeds)


def test_row_stats_match_their_definitions() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    logits[2, MASK] = 50.0  # the mask's row: excluded, its argmax is the runner-up
    logits[3, [1, 4]] = 9.0  # a tie for the top: no slack
    stats = RowStats.of(logits, MASK)
    kept = logits.clone()
    kept[:, MASK] = float("-inf")
    log_probs = kept.log_softmax(-1)
    probs = log_probs.exp()
    assert torch.equal(stats.token, kept.argmax(-1))
    assert torch.equal(stats.confidence, probs.max(-1).values)
    top = kept.topk(2).values  # the definitions, bit for bit (the kernel avoids topk's slow CPU path)
    assert torch.equal(stats.margin, (top[:, 0] - top[:, 1]) / kept.masked_fill(kept.isinf(), 0).abs().amax(-1))
    assert stats.margin[3] == 0
    assert torch.equal(stats.entropy, -torch.where(probs > 0, probs * log_probs, 0.0).sum(-1))
    lean = RowStats.of(logits, MASK, scores=False, margins=False)  # what a decision on the argmax alone reads
    assert torch.equal(lean.token, stats.token) and lean.margin.isinf().all() and lean.entropy.isnan().all()
    assert torch.equal(logits[2, MASK], torch.tensor(50.0))  # the caller's float32 logits untouched
    raw = RowStats.of(logits)
    assert torch.allclose(raw.entropy, -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1))
    assert RowReading().excluded is None
    host = stats.host()
    assert torch.equal(host.token, stats.token) and torch.equal(host.margin, stats.margin)


@pytest.mark.parametrize("keep_logits", [False, True])
def test_cpu_passes_in_chunks_equal_one_pass(monkeypatch: pytest.MonkeyPatch, keep_logits: bool) -> None:
    logits = torch.randn(11, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    excluding = torch.arange(11) % 3 != 0
    whole = row_stats.RowStats.of(logits, MASK, keep_logits, excluding)
    monkeypatch.setattr(row_stats, "CPU_PASS_ELEMENTS", 4 * VOCAB)  # passes of 4, 4 and 3 rows
    chunked = row_stats.RowStats.of(logits, MASK, keep_logits, excluding)
    for name in ("token", "margin", "entropy", "confidence", "logits"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert (a is None and b is None) if not keep_logits and name == "logits" else torch.equal(a, b), name


def test_a_plain_jacobi_step_moves_on_as_a_verified_one() -> None:
    """A greedy Jacobi step with no draft to verify (capped at 0) takes the batch's short path; it leaves the
    decoder as the general verification of a one-row window leaves it (blocks, pool, drafts, outcome)."""
    generator, checked = torch.Generator().manual_seed(3), 0
    for decoder in decoders("jacobi", [None] * 6):
        for step in range(12):  # a few steps in, with blocks spawned and a pool
            decoder.cap(0 if step % 4 == 3 else None)
            sizes = [decoder.next_forward().logit_rows.numel()]
            logits = torch.randn(sizes[0], VOCAB, generator=generator) * 4
            logits[:, 4:7] += 6
            apply_rows([decoder], logits, sizes)
            if decoder.finished:
                break
        if decoder.finished:
            continue
        decoder.cap(0)
        decoder.next_forward()
        rows = RowStats.of(torch.randn(1, VOCAB, generator=generator))
        short, general = copy.deepcopy(decoder), copy.deepcopy(decoder)
        token = int(rows.token[0])
        outcomes = (short._plain_step(token, float(rows.margin[0])),
                    general._verified(rows, [], [0], [token], 1, True))
        assert outcomes[0] == outcomes[1]
        assert {k: v for k, v in vars(short).items() if k != "generator"} == {
            k: v for k, v in vars(general).items() if k != "generator"}
        checked += 1
    assert checked >= 3  # not vacuous: half the decoders are still going after a dozen steps


def held(decoder) -> dict:
    """What a decoder holds between steps, tensors as lists (not its generator, margins or planned forward)."""
    return {k: v.tolist() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in vars(decoder).items()
            if k not in ("generator", "margins") and not k.startswith("_")}


@pytest.mark.parametrize("method", ["quadratic", "jacobi"])
def test_a_paused_decoder_catches_up_as_its_own_plain_steps_leave_it(method: str) -> None:
    """An engine takes a greedy request's plain AR steps itself (`pause`), then hands it the tokens it committed
    (`catch_up`): the decoder is where its own plain steps would have left it (quadratic holding no draft from before
    the pause, Jacobi's blocks moved on as its plain steps move them) and plans the same next forward."""
    generator, checked = torch.Generator().manual_seed(5), 0
    for decoder in decoders(method, [None] * 6):
        for _ in range(3):  # a few drafting steps in: it holds drafts
            if decoder.finished:
                break
            decoder.cap(2)
            sizes = [decoder.next_forward().logit_rows.numel()]
            logits = torch.randn(sizes[0], VOCAB, generator=generator) * 4
            logits[:, 4:7] += 6  # drafts match now and then
            apply_rows([decoder], logits, sizes)
        if decoder.finished or (method == "quadratic" and decoder.drafts.numel() == 0):
            continue
        decoder.verified = (0, 0)  # told to the planner before it capped them (`cap_widths`)
        own, paused = copy.deepcopy(decoder), copy.deepcopy(decoder)
        tokens = [5, 7, 6, 6, 4]
        for token in tokens:
            own.cap(0)
            own.next_forward()
            logits = torch.zeros(1, VOCAB)
            logits[0, token] = 1.0
            apply_rows([own], logits, [1])
        paused.cap(0)
        paused.pause()
        paused.catch_up(tokens)
        assert held(paused) == held(own)
        assert held(paused) != held(decoder)
        for d in (own, paused):
            d.cap(2)
        planned = own.next_forward(), paused.next_forward()
        assert torch.equal(planned[0].token_ids, planned[1].token_ids)
        assert torch.equal(planned[0].positions, planned[1].positions)
        checked += 1
    assert checked >= 2


def test_a_jacobi_decoder_tells_a_planner_only_what_iterated_drafts_accepted() -> None:
    """Jacobi's first drafts (copies of the first token), and those after a plain step or a pause, are stale, and so
    are the drafts of the forward after: how they fare is not told to a width planner (`verified` stays (0, 0)); the
    drafts of `SETTLED_AFTER` (2) drafting forwards in a row are told (`Decoder.iterated`)."""
    generator = torch.Generator().manual_seed(7)

    def step(decoder, cap: int) -> None:
        decoder.cap(cap)
        rows = decoder.next_forward().logit_rows.numel()
        logits = torch.randn(rows, VOCAB, generator=generator) * 4
        logits[:, 3] = -1e9  # no EOS: every decoder runs the whole sequence below
        apply_rows([decoder], logits, [rows])

    for decoder in decoders("jacobi", [None] * 6):
        assert decoder.SETTLED_AFTER == 2
        step(decoder, 2)  # the prefill
        assert not decoder.iterated
        step(decoder, 2)  # its first drafts: copies of the first token
        assert decoder.verified == (0, 0) and not decoder.iterated
        step(decoder, 2)  # drafts one forward made
        assert decoder.verified == (0, 0) and decoder.iterated
        step(decoder, 2)
        assert decoder.verified[0] >= 1 and decoder.iterated
        step(decoder, 0)  # a plain step
        assert decoder.verified == (0, 0) and not decoder.iterated
        step(decoder, 2)
        step(decoder, 2)
        assert decoder.verified == (0, 0) and decoder.iterated
        decoder.cap(0)
        decoder.pause()
        decoder.catch_up([5, 6])
        assert not decoder.iterated
