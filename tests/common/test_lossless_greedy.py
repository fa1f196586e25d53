"""Greedy Jacobi (plain and multi-block with recycling), diffusion self-speculation (linear and quadratic) and
WeDLM-drafted speculation equal greedy AR exactly."""

import pytest

from parallel_decoding.common.checkpoint import load, resolve_mask_token_id
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.jacobi import JacobiConfig
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecConfig, quadratic_forward
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties

MAX_TOKENS = 29
EOS_AT = 9
LOSSLESS = [
    ("jacobi", {"block_size": 1}),
    ("jacobi", {"block_size": 5}),
    ("jacobi", {"block_size": 16}),
    ("jacobi", {"block_size": 4, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4, "verification_size": 2}),
    ("jacobi", {"block_size": 6, "num_blocks": 3, "spawn_ratio": 0.3, "pool_size": 8, "verification_size": 4}),
    ("jacobi", {"block_size": 3, "num_blocks": 1, "pool_size": 16, "verification_size": 8}),
    ("diffusion_self", {"num_speculative_tokens": 1}),
    ("diffusion_self", {"num_speculative_tokens": 4}),
    ("diffusion_self", {"num_speculative_tokens": 4, "dlm_type": "dream"}),
    ("diffusion_self", {"num_speculative_tokens": 16}),
    ("diffusion_self", {"num_speculative_tokens": 31}),
    ("diffusion_self_quadratic", {"block_size": 2}),
    ("diffusion_self_quadratic", {"block_size": 5}),
    ("diffusion_self_quadratic", {"block_size": 5, "dlm_type": "dream"}),
    ("diffusion_self_quadratic", {"block_size": 16}),
    ("diffusion_self", {"num_speculative_tokens": 3, "mode": "quadratic"}),
    ("jacobi", {"block_size": 4, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4, "recycling": "linear"}),
    ("wedlm_spec", {"window": 2}),
    ("wedlm_spec", {"window": 16}),
]


def generate(model, method, config, prompt_ids, limits):
    decoder = make_decoder(method, config, prompt_ids, SamplingParams(), limits)
    return ReferenceRunner(model).run(decoder).token_ids


def truncate_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def references(tiny, prompts):
    """Per prompt: token ids, greedy AR output without EOS and its margins, and an EOS id that occurs
    mid-generation."""
    model, tokenizer = tiny
    cases = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        ar = ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(MAX_TOKENS)))
        cases.append((ids, ar.token_ids, ar.margins, ar.token_ids[EOS_AT]))
    return model, cases


# Wider settings of a method CI runs at another width (one token, 16 and 31 drafts, a third Jacobi block) as sweeps.
SWEPT = {0, 2, 4, 6, 9, 10, 11, 14, 18}


@pytest.mark.parametrize(("method", "settings"), [
    pytest.param(m, s, id=f"{m}-{s}", marks=[pytest.mark.sweep] if i in SWEPT else []) for i, (m, s) in enumerate(
        LOSSLESS)])
def test_equals_greedy_ar(references, method, settings):
    model, cases = references
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    got, want, margins = [], [], []
    for ids, ar, ar_margins, eos in cases:
        expected = truncate_at(ar, eos)
        got += [generate(model, method, config, ids, Limits(MAX_TOKENS)),
                generate(model, method, config, ids, Limits(MAX_TOKENS, (eos,)))]
        want += [ar, expected]
        margins += [ar_margins, ar_margins[: len(expected)]]
    ties.compare(got, want, margins)
    assert all(len(expected) < MAX_TOKENS for expected in want[1::2])


def test_mistral_family(tiny_dir, prompts):
    """The runner also drives the Mistral family: Jacobi and self-speculation equal its greedy AR."""
    model, tokenizer = load(tiny_dir / "mistral")
    got, want, margins = [], [], []
    for prompt in prompts[:6]:
        ids = tokenizer.encode(prompt)
        ar = ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(MAX_TOKENS)))
        for method, settings in (LOSSLESS[3], LOSSLESS[7]):
            config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
            got.append(generate(model, method, config, ids, Limits(MAX_TOKENS)))
            want.append(ar.token_ids)
            margins.append(ar.margins)
    ties.compare(got, want, margins)


def test_rejection_recycling_fast_forwards_from_pool(qwen3, prompts):
    """A pool holding the true continuation lets recycled branches commit several tokens per forward."""
    model, tokenizer = qwen3
    config = JacobiConfig(block_size=3, pool_size=64, verification_size=4)
    got, want, margins = [], [], []
    for prompt in prompts[:4]:
        ids = tokenizer.encode(prompt)
        ar = ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(MAX_TOKENS)))
        decoder = make_decoder("jacobi", config, ids, SamplingParams(), Limits(MAX_TOKENS))
        decoder.pool.append(ar.token_ids)
        result = ReferenceRunner(model).run(decoder)
        got.append(result.token_ids)
        want.append(ar.token_ids)
        margins.append(ar.margins)
        assert result.forwards <= 1 + MAX_TOKENS // 2
    ties.compare(got, want, margins)


def tokens_per_forward(results) -> float:
    return sum(len(r.token_ids) for r in results) / sum(r.forwards for r in results)


@pytest.mark.parametrize("recycling", ["branches", "linear"])
def test_rejection_recycling_earns_its_forwards(cyclic, recycling):
    """On a model whose greedy output walks cycles, the pool of what the trajectory showed (recent output, commits,
    predictions) fast-forwards multi-block Jacobi well past plain Jacobi, which gains nothing there; a pool of
    rejected drafts alone (the rule before) stays at plain Jacobi's 1.0."""
    _, model, prompts = cyclic
    settings = {"block_size": 16, "num_blocks": 2, "spawn_ratio": 0.85, "verification_size": 4,
                "recycling": recycling}
    ar = [ReferenceRunner(model).run(make_decoder("ar", None, p, SamplingParams(), Limits(64))) for p in prompts]
    runs = {}
    for pool in (0, 4):
        config = JacobiConfig(**settings, pool_size=pool)
        runs[pool] = [ReferenceRunner(model).run(make_decoder("jacobi", config, p, SamplingParams(), Limits(64)))
                      for p in prompts]
        assert [r.token_ids for r in runs[pool]] == [r.token_ids for r in ar]
    plain, recycled = tokens_per_forward(runs[0]), tokens_per_forward(runs[4])
    assert recycled >= 1.5 and recycled >= plain + 0.4, (plain, recycled)


def test_quadratic_forwards_stay_inside_the_context(references):
    """Near the end of the context a quadratic step drafts less, then forwards its chain alone: every forward's
    rows fit, laid after the cached ones, and the tokens are still greedy AR's."""
    model, cases = references
    config = parse_config("diffusion_self_quadratic", {"block_size": 5}, mask_token_id=model.config.mask_token_id)
    got, want, margins, ends = [], [], [], []
    for ids, ar, ar_margins, _ in cases[:4]:
        context = len(ids) + MAX_TOKENS + 2
        decoder = make_decoder("diffusion_self_quadratic", config, ids, SamplingParams(), Limits(MAX_TOKENS,
                                                                                                 context=context))
        plan = decoder.next_forward

        def next_forward(decoder=decoder, plan=plan, context=context):
            forward = plan()
            ends.append(decoder.cache_len + forward.num_tokens - context)
            return forward

        decoder.next_forward = next_forward
        got.append(ReferenceRunner(model).run(decoder).token_ids)
        want.append(ar)
        margins.append(ar_margins)
    ties.compare(got, want, margins)
    assert max(ends) <= 0 < -min(ends)


@pytest.mark.parametrize("dlm_type", ["llada", "dream"])
def test_quadratic_layout_matches_its_definition(dlm_type):
    """The quadratic forward (laid once per chain length, in tensor ops): the chain causal at its positions, then
    per chain token `a` a group `[a, mask x k]` from a's position that sees the chain before `a` and its own group,
    read on the slots `common.draft_layout` names."""
    k, mask, chain, start = 3, 99, [7, 8, 9], 20
    config = QuadraticSelfSpecConfig(block_size=k, mask_token_id=mask, dlm_type=dlm_type)
    forward = quadratic_forward(chain, start, config)
    m, g = len(chain), k + 1
    ids, positions, rows = list(chain), list(range(start, start + m)), list(range(m))
    owner = list(range(m))
    for a, token in enumerate(chain):
        ids += [token] + [mask] * k
        positions += range(start + a, start + a + g)
        rows += [m + a * g + j + (dlm_type != "dream") for j in range(k)]
        owner += [a] * g
    visible = [[(j < m and (j <= i if i < m else j < owner[i])) or (m <= i and m <= j and owner[i] == owner[j])
                for j in range(len(ids))] for i in range(len(ids))]
    assert forward.token_ids.tolist() == ids and forward.positions.tolist() == positions
    assert forward.logit_rows.tolist() == rows and forward.visibility().tolist() == visible
    alone = quadratic_forward(chain, start, config, grouped=False)
    assert alone.token_ids.tolist() == chain and alone.visibility().tolist() == [[j <= i for j in range(m)]
                                                                                  for i in range(m)]


def rows_capped(method: str, cap: int, chain: int) -> int:
    """Rows of a step capped at `cap` with `chain` drafts in hand (quadratic: a group of cap + 2 per chain token;
    wedlm_spec: cap + 1 mask slots; the seed alone at 0), away from the end of the output."""
    if method == "wedlm_spec":
        return 1 + chain + (cap + 1 if cap else 0)
    return (chain + 1) * (1 + (cap + 2 if cap else 0))


@pytest.mark.parametrize(("checkpoint", "method", "settings"), [("nld", "diffusion_self_quadratic", {"block_size": 6}),
                                                                 ("wedlm", "wedlm_spec", {"window": 6})])
def test_steps_capped_by_a_width_planner_stay_greedy_ar(checkpoint, method, settings):
    """On the trained checkpoints: drafts capped per step as an engine's width planner caps them (0: the seed
    alone, a plain AR step; fewer than the drafts in hand: the chain cut; fewer mask slots) change the rows
    forwarded, never the tokens, and the drafts kept are still accepted."""
    model, tokenizer = load(SHIPPED / checkpoint)
    config = parse_config(method, settings, mask_token_id=resolve_mask_token_id(model.config, tokenizer, None))
    caps = [5, 2, 0, 3, 5, 1, 4, 0, 5, 5]
    got, want, shapes, accepted = [], [], [], 0
    for prompt in corpus.prompts(4):
        ids = tokenizer.encode(prompt)
        want.append(ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(MAX_TOKENS))))
        decoder = make_decoder(method, config, ids, SamplingParams(), Limits(MAX_TOKENS + 8))
        plan, steps = decoder.plan, iter(caps * 8)

        def capped(decoder=decoder, plan=plan, steps=steps):
            cap, had = next(steps), decoder.drafts.numel()
            decoder.cap(cap)
            forward = plan()
            if decoder.remaining > 8:
                shapes.append((cap, had, decoder.drafts.numel(), forward.num_tokens))
            return forward

        decoder.plan = capped
        got.append(ReferenceRunner(model).run(decoder).token_ids[:MAX_TOKENS])
        accepted += decoder.acceptance.num_accepted_tokens
    ties.compare(got, [w.token_ids for w in want], [w.margins for w in want])
    for cap, had, chain, rows in shapes:
        assert chain == min(had, cap) and rows == rows_capped(method, cap, chain)
    assert any(had > cap > 0 for cap, had, *_ in shapes) and any(cap == 0 < had for cap, had, *_ in shapes)
    assert accepted >= len(shapes) // 4


def test_recycling_jacobi_capped_by_a_width_planner_stays_greedy_ar():
    """On the trained Jacobi Forcing checkpoint, multi-block Jacobi with rejection recycling capped per step as an
    engine's width planner caps it: the main drafts and each recycled branch cut to the cap (0: the seed alone, a
    plain AR step), AR's tokens all the same, and drafts still accepted."""
    model, tokenizer = load(SHIPPED / "jacobi_forcing")
    config = parse_config("jacobi", {"block_size": 4, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 8,
                                     "verification_size": 4})
    caps = [8, 3, 0, 5, 8, 1, 6, 0, 8, 8]
    got, want, shapes, accepted = [], [], [], 0
    for prompt in corpus.prompts(4):
        ids = tokenizer.encode(prompt)
        want.append(ReferenceRunner(model).run(make_decoder("ar", None, ids, SamplingParams(), Limits(MAX_TOKENS))))
        decoder = make_decoder("jacobi", config, ids, SamplingParams(), Limits(MAX_TOKENS + 8))
        plan, steps = decoder.plan, iter(caps * 8)

        def capped(decoder=decoder, plan=plan, steps=steps):
            cap, pending = next(steps), decoder.num_tokens - decoder.cache_len
            decoder.cap(cap)
            forward = plan()
            shapes.append((cap, len(decoder._main), [len(b) for b in decoder._branches], pending, forward.num_tokens))
            return forward

        decoder.plan = capped
        got.append(ReferenceRunner(model).run(decoder).token_ids[:MAX_TOKENS])
        accepted += decoder.acceptance.num_accepted_tokens
    ties.compare(got, [w.token_ids for w in want], [w.margins for w in want])
    for cap, main, branches, pending, rows in shapes:
        assert main <= cap and all(0 < b <= cap for b in branches) and rows == pending + main + sum(branches)
    assert all(rows == pending for cap, _, _, pending, rows in shapes if cap == 0)
    assert any(branches for *_, branches, _, _ in shapes) and accepted >= len(shapes) // 4
