"""vLLM with `diffusion_self` in mode `quadratic`: one forward per step (the chain verified causally, the groups'
structured mask applied inside the same forward) returns exactly the tokens of `parallel-decoding generate`,
greedy and sampled, batched; on the shipped trained NLD checkpoint it is greedy AR, accepts the drafts the
reference accepts, and runs one forward per step; its width planner decides the rows forwarded."""

from collections import Counter

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.reference_cli import SEED, reference
from tests.support.vllm_cases import planner_decides

SPEC = {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3}
MAX_TOKENS = 40


@pytest.mark.parametrize(("temperature", "alone"), [(0.0, False), (1.0, False), (0.0, True)],
                         ids=["greedy", "sampled", "greedy-alone"])
def test_equals_reference_cli(engine_dir, prompts, tmp_path, temperature, alone):
    """`alone`: one request on the trained checkpoint, whose drafts land: its groups' rows and its chain are each one
    run of the step (`group_attention`'s views), and a fully accepted chain keeps the KV restored after them."""
    model_dir = SHIPPED / "nld" if alone else engine_dir["qwen3"]
    prompts = prompts[3:4] if alone else prompts  # the one of them whose drafts land most
    expected, margins = reference(model_dir, SPEC, prompts, tmp_path, temperature)
    params = SamplingParams(temperature=temperature, seed=SEED, max_tokens=len(expected[0]))
    with engine(model_dir, SPEC) as llm:
        outputs = llm.generate(prompts, params)
    ties.compare([list(o.outputs[0].token_ids) for o in outputs], expected, margins)


def test_trained_nld_greedy_equals_ar_and_accepts_as_the_reference():
    """On held-out prompts whose reference decoding takes no near-tied decision; at the configured width
    (`adaptive: false`) vLLM's counters are the reference's: one step per forward, the reference's accepted drafts.
    The width planner decides what is forwarded: with rows dear (`step_cost`) every step forwards the chain alone
    (no draft at all), with rows free the full width, as pinned; greedy AR's tokens every time."""
    model_dir = SHIPPED / "nld"
    settings = {k: v for k, v in SPEC.items() if k != "method"}
    prompts, reference_decoders, want = ties.untied_references(model_dir, "diffusion_self", settings,
                                                               corpus.prompts(12), MAX_TOKENS)
    assert len(prompts) >= 6
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    fixed = planner_decides(model_dir, SPEC, prompts, params, want)
    assert fixed.num_accepted_tokens == sum(d.acceptance.num_accepted_tokens for d in reference_decoders)
    assert fixed.num_drafts == sum(d.forwards - 1 for d in reference_decoders)  # one forward per step
    assert sum(d.tokens_per_forward for d in reference_decoders) / len(prompts) > 1.2


def assert_capped_equals_ar(engine_dir, prompts, monkeypatch, cap_widths) -> None:
    """With the planner's caps replaced by `cap_widths(planner, keys, decoders)`, quadratic's greedy tokens are vLLM's
    own AR tokens."""
    from parallel_decoding.vllm_plugin import quadratic_self_spec

    monkeypatch.setattr(quadratic_self_spec, "cap_widths", cap_widths)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with engine(engine_dir["qwen3"]) as llm:
        want = llm.generate(prompts, greedy)
    with engine(engine_dir["qwen3"], SPEC) as llm:
        got = llm.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in got] == [w.outputs[0].token_ids for w in want]


def test_a_request_held_at_no_draft_until_its_last_step(engine_dir, prompts, monkeypatch):
    """A request the planner holds at no draft (its decoder paused, vLLM's sampler taking its plain steps) and gives
    drafts at the step whose token ends it: its decoder, woken, takes that token and plans nothing past its end
    (the engine died on it, 2026-11-29). vLLM's own greedy tokens."""
    steps: Counter = Counter()

    def last_step_only(planner, keys, decoders):
        for key, decoder in zip(keys, decoders, strict=True):
            steps[key] += 1  # a step's draft: the request holds as many tokens as it has had steps
            decoder.cap(decoder.most_drafts if steps[key] == MAX_TOKENS else 0)

    assert_capped_equals_ar(engine_dir, prompts, monkeypatch, last_step_only)
    assert sorted(set(steps.values())) == [MAX_TOKENS] and len(steps) == len(prompts)


def test_requests_capped_at_different_widths_share_a_step(engine_dir, prompts, monkeypatch):
    """The planner caps each request on its own, so one step's windows have groups of different sizes (the engine
    died on it where the planner gave requests different widths, 2026-12-01). vLLM's own greedy tokens."""
    steps: Counter = Counter()
    mixed = []  # per step, whether requests drafting in it had different widths

    def varied(planner, keys, decoders):
        widths = set()
        for row, (key, decoder) in enumerate(zip(keys, decoders, strict=True)):
            steps[key] += 1
            width = (row + steps[key]) % (decoder.most_drafts + 1)
            decoder.cap(width)
            widths |= {width} - {0}
        mixed.append(len(widths) > 1)

    assert_capped_equals_ar(engine_dir, prompts, monkeypatch, varied)
    assert sum(mixed) > 10
