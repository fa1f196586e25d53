"""Under sampling, Jacobi and diffusion self-speculation produce exactly the model's distribution.

A tiny-vocabulary model makes the AR joint of 3-token continuations enumerable; the empirical distribution
of each method is compared with it by a chi-square test, and a deliberately wrong acceptance rule must fail
the same test.
"""


import pytest

import parallel_decoding.common.diffusion_self
import parallel_decoding.common.jacobi
import parallel_decoding.common.wedlm_spec
from parallel_decoding.common.acceptance import verify
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner_widths import reference_planner
from parallel_decoding.common.sampling import SamplingParams, sample, target_probs
from scripts.make_tiny_models import build_model
from tests.support.exact import (
    LENGTH,
    MASK,
    P_VALUE_FLOOR,
    PARAMS,
    PROMPT,
    SAMPLES,
    SPEC_CASE,
    SPEC_LENGTH,
    VOCAB,
    MemoRunner,
    chi_square_p_value,
    exact_joint,
)

CASES = [
    ("jacobi", {"block_size": 3}),
    ("jacobi", {"block_size": 2, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4, "verification_size": 2}),
    ("jacobi", {"block_size": 3, "pool_size": 4, "recycling": "linear"}),
    ("diffusion_self", {"num_speculative_tokens": 2}),
]  # quadratic self-speculation: over 4 tokens, where it verifies drafts (below)


@pytest.fixture(scope="module")
def small_model():
    return build_model("qwen3", VOCAB, MASK, eos_token_id=None, seed=3, hidden_size=32)




def empirical(model, method: str, settings: dict, params: SamplingParams, length: int = LENGTH,
              caps: tuple[int, ...] = ()) -> dict[tuple[int, ...], int]:
    """Counts of each continuation over `SAMPLES` seeds; `caps`: the drafts the decoder may verify at each
    step, as an engine's width planner caps them (`cap`)."""
    config = parse_config(method, settings, mask_token_id=MASK)
    runner = MemoRunner(model)
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        request = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        decoder = make_decoder(method, config, PROMPT, request, Limits(length))
        if caps:
            decoder.plan = capped(decoder, caps)
        key = tuple(runner.run(decoder).token_ids)
        counts[key] = counts.get(key, 0) + 1
    return counts




def resample_from_target(drafts, target_logits, params, generator, draft_probs=None):
    """A wrong rule: on rejection, resample from the target instead of the residual distribution."""
    committed = verify(drafts, target_logits, params, generator, draft_probs)
    accepted = len(committed) - 1
    if accepted < drafts.numel():
        committed[-1] = int(sample(target_probs(target_logits[accepted : accepted + 1], params)[0], generator))
    return committed


# Every case at temperature 1; under top-p, plain Jacobi and self-speculation in CI, the multi-block and recycling
# Jacobi cases as sweeps (the same verification, other drafts).
GRID = [pytest.param(method, settings, params, id=f"{method}-{settings}-{label}",
                     marks=[pytest.mark.sweep] if label != "t1" and i in (1, 2) else [])
        for label, params in zip(["t1", "t0.8-topp0.8"], PARAMS, strict=True)
        for i, (method, settings) in enumerate(CASES)]


@pytest.mark.parametrize(("method", "settings", "params"), GRID)
def test_distribution_matches_ar(small_model, method, settings, params):
    p_value = chi_square_p_value(empirical(small_model, method, settings, params), exact_joint(small_model, params))
    assert p_value > P_VALUE_FLOOR


def capped(decoder, caps: tuple[int, ...]):
    """The decoder's `plan`, capped from `caps` at each step first."""
    plan, steps = decoder.plan, iter(caps)

    def plan_capped():
        decoder.cap(next(steps, caps[-1]))
        return plan()

    return plan_capped


# The capped runs' first step is at the full width (a sweep runs the full width throughout).
@pytest.mark.parametrize("caps", [pytest.param((), marks=pytest.mark.sweep), (3, 1),
                                  pytest.param((1, 0), marks=pytest.mark.sweep)], ids=["full", "capped", "chain-alone"])
def test_quadratic_distribution_matches_ar_under_any_widths(small_model, caps):
    """Quadratic self-speculation over 4 tokens (its second step verifies a draft), at the full width, with
    narrower groups, and with its draft dropped for the chain alone (a width planner's caps)."""
    params = PARAMS[0]
    counts = empirical(small_model, "diffusion_self_quadratic", {"block_size": 4}, params, SPEC_LENGTH, caps)
    assert chi_square_p_value(counts, exact_joint(small_model, params, SPEC_LENGTH)) > P_VALUE_FLOOR


def test_recycling_jacobi_distribution_matches_ar_under_any_widths(small_model):
    """Jacobi with rejection recycling over 4 tokens, its main drafts and branches capped per step."""
    params = PARAMS[0]
    counts = empirical(small_model, "jacobi", {"block_size": 3, "pool_size": 4}, params, SPEC_LENGTH, (2, 1, 0, 3))
    assert chi_square_p_value(counts, exact_joint(small_model, params, SPEC_LENGTH)) > P_VALUE_FLOOR


@pytest.mark.parametrize("caps", [(2, 1), pytest.param((1, 0), marks=pytest.mark.sweep)], ids=["capped", "seed-alone"])
def test_wedlm_spec_distribution_matches_ar_under_any_widths(small_model, caps):
    """WeDLM-drafted speculation with its drafts and mask slots capped per step (a width planner's caps)."""
    params = PARAMS[0]
    counts = empirical(small_model, *SPEC_CASE, params, SPEC_LENGTH, caps)
    assert chi_square_p_value(counts, exact_joint(small_model, params, SPEC_LENGTH)) > P_VALUE_FLOOR


@pytest.mark.parametrize("wrong_rule", [pytest.param(False, marks=pytest.mark.sweep), True],
                         ids=["exact", "wrong-rule-detected"])  # exact: the capped run's first step is the full window
def test_wedlm_spec_distribution_matches_ar(small_model, monkeypatch, wrong_rule):
    if wrong_rule:
        monkeypatch.setattr(parallel_decoding.common.wedlm_spec, "verify", resample_from_target)
    params = PARAMS[0]
    p_value = chi_square_p_value(empirical(small_model, *SPEC_CASE, params, SPEC_LENGTH),
                                 exact_joint(small_model, params, SPEC_LENGTH))
    assert (p_value < P_VALUE_FLOOR) == wrong_rule


# Cases whose verification goes through the patched `verify` (plain and linear-recycling Jacobi, self-speculation).
WRONG_RULE_CASES = [CASES[0], pytest.param(*CASES[2], marks=pytest.mark.sweep), CASES[3]]


@pytest.mark.parametrize(("method", "settings"), WRONG_RULE_CASES, ids=["jacobi", "jacobi-linear", "diffusion_self"])
def test_wrong_acceptance_rule_is_detected(small_model, monkeypatch, method, settings):
    monkeypatch.setattr(parallel_decoding.common.jacobi, "verify", resample_from_target)
    monkeypatch.setattr(parallel_decoding.common.diffusion_self, "verify", resample_from_target)
    params = PARAMS[0]
    p_value = chi_square_p_value(empirical(small_model, method, settings, params), exact_joint(small_model, params))
    assert p_value < P_VALUE_FLOOR


def test_self_speculation_distribution_matches_ar_under_the_reference_runners_planner(small_model):
    """Linear self-speculation in the reference runner with its width planner (`"adaptive": true`, a fixed cost at
    which the plan follows each request's acceptance): the caps vary from request to request and step to step
    (2, 1 and 0: a plain step, no draft forward), and the output is still the model's distribution."""
    params = PARAMS[0]
    config = parse_config("diffusion_self", {"num_speculative_tokens": 2, "adaptive": True,
                                             "step_cost": [1.0, 0.1, 0.1]}, mask_token_id=MASK)
    runner = MemoRunner(small_model)
    runner.planner = reference_planner(config)
    counts: dict[tuple[int, ...], int] = {}
    caps = set()
    for seed in range(SAMPLES):
        request = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        decoder = make_decoder("diffusion_self", config, PROMPT, request, Limits(SPEC_LENGTH))
        for _ in runner.steps(decoder):
            caps.add(decoder.draft_cap)
        counts[tuple(decoder.output)] = counts.get(tuple(decoder.output), 0) + 1
    assert caps == {0, 1, 2}
    assert chi_square_p_value(counts, exact_joint(small_model, params, SPEC_LENGTH)) > P_VALUE_FLOOR
