"""The reference runner's width planner (`common.runner_widths`, `"adaptive": true`): greedy output stays AR's token
for token while its widths vary from step to step; with rows dear it forwards no draft, with rows free every step
forwards what the configured width does; left unset, the reference forwards the configured width."""

import itertools

import pytest

from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.runner_widths import reference_planner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.width_planner import WidthPlanner
from scripts.bench import PROMPTS
from scripts.trained_models import SHIPPED

MAX_TOKENS = 24
# Checkpoint, method, settings, and a row's cost at which its widths vary (a step's base cost is 1).
CASES = [
    ("jacobi_forcing", "jacobi", {"block_size": 8}, 0.1),
    ("jacobi_forcing", "jacobi", {"block_size": 4, "num_blocks": 2, "spawn_ratio": 0.5, "pool_size": 4,
                                  "verification_size": 2}, 0.1),
    ("nld", "diffusion_self", {"num_speculative_tokens": 6}, 0.1),
    ("nld", "diffusion_self", {"num_speculative_tokens": 3, "mode": "quadratic"}, 0.05),
    ("wedlm", "wedlm_spec", {"window": 6}, 0.1),
]
IDS = ["jacobi", "jacobi-recycling", "diffusion_self", "quadratic", "wedlm_spec"]
# A step's cost: base, per row, per drafting step (`common.width_planner.StepCost`).
DEAR, FREE = [0.01, 1.0, 1.0], [1.0, 0.0, 0.0]


def run(checkpoint: str, method: str, settings: dict) -> tuple[list[list[int]], int, int, list[int]]:
    """Each prompt greedy in the reference runner: the outputs, forwards, rows forwarded and the caps planned."""
    setup = reference_setup(SHIPPED / checkpoint, method, settings)
    limits = setup.limits(MAX_TOKENS, stop_at_eos=False)
    outputs, forwards, rows, caps = [], 0, 0, []
    for prompt in PROMPTS[:3]:
        decoder = setup.decoder(setup.tokenizer.encode(prompt), SamplingParams(), limits)
        for step in setup.runner.steps(decoder):
            rows += step.forward.num_tokens
            caps.append(getattr(decoder, "draft_cap", None))
        outputs.append(list(decoder.output))
        forwards += decoder.forwards
    return outputs, forwards, rows, caps


@pytest.mark.parametrize(("checkpoint", "method", "settings", "row_cost"), CASES, ids=IDS)
def test_the_planner_decides_the_reference_runners_widths_and_output_stays_ar(checkpoint, method, settings, row_cost):
    want, ar_forwards, ar_rows, _ = run(checkpoint, "ar", {})
    pinned, pinned_forwards, pinned_rows, _ = run(checkpoint, method, {**settings, "adaptive": False})
    unset = run(checkpoint, method, settings)
    assert pinned == unset[0] == want and unset[1:3] == (pinned_forwards, pinned_rows)  # unset: the configured width
    assert pinned_forwards < ar_forwards
    dear, dear_forwards, dear_rows, dear_caps = run(checkpoint, method, {**settings, "adaptive": True,
                                                                          "step_cost": DEAR})
    assert dear == want and (dear_forwards, dear_rows) == (ar_forwards, ar_rows)  # no draft at all
    assert set(dear_caps) == {0}
    free, free_forwards, free_rows, _ = run(checkpoint, method, {**settings, "adaptive": True, "step_cost": FREE})
    assert free == want and (free_forwards, free_rows) == (pinned_forwards, pinned_rows)
    middling = [1.0, row_cost, 0.1]
    middling, _, middling_rows, caps = run(checkpoint, method, {**settings, "adaptive": True, "step_cost": middling})
    assert middling == want and dear_rows < middling_rows < pinned_rows
    assert len(set(caps)) > 1, caps  # the widths vary from step to step


def test_only_the_lossless_methods_that_ask_get_a_planner():
    from parallel_decoding.common.methods import parse_config

    assert reference_planner(parse_config("jacobi", {"block_size": 4})) is None
    assert isinstance(reference_planner(parse_config("jacobi", {"block_size": 4, "adaptive": True})), WidthPlanner)
    assert reference_planner(parse_config("wedlm", {"window": 4})) is None
    quadratic = reference_planner(parse_config("diffusion_self", {"num_speculative_tokens": 3, "mode": "quadratic",
                                                                   "adaptive": True}))
    assert quadratic.shape.quadratic and quadratic.max_width == 3
    linear = reference_planner(parse_config("diffusion_self", {"num_speculative_tokens": 5, "adaptive": True}))
    assert linear.shape.extra_forward and linear.max_width == 5


def test_a_scripted_clock_times_the_planners_steps(monkeypatch):
    """With a `clock` (`scripts.replay_widths`), the measured planner fits the clock's cost, not this machine's time:
    rows made dear by the clock hold every step at no draft once the fit has seen them; free, it drafts. Nor does
    the time between steps reach it (`StepGap`): with the machine's clock jumping, the plans are the same."""
    import random

    from parallel_decoding.common import width_planner
    from parallel_decoding.common.width_planner import planner_for

    setup = reference_setup(SHIPPED / "jacobi_forcing", "jacobi", {"block_size": 8, "adaptive": True})
    limits = setup.limits(MAX_TOKENS, stop_at_eos=False)

    def caps(clock) -> list[int]:
        setup.runner.planner, setup.runner.clock = planner_for(setup.config), clock
        seen = []
        for prompt in PROMPTS[:3]:
            decoder = setup.decoder(setup.tokenizer.encode(prompt), SamplingParams(), limits)
            for _ in setup.runner.steps(decoder):
                seen.append(decoder.draft_cap)
        return seen

    dear = caps(lambda rows, drafting: 1.0 + rows)  # a row costs a step's base
    assert set(dear[-MAX_TOKENS:]) == {0}
    free = caps(lambda rows, drafting: 1.0)
    assert max(free[-MAX_TOKENS:]) == 8
    middling = caps(lambda rows, drafting: 1.0 + 0.1 * rows + 0.5 * drafting)
    assert len(set(middling)) > 1
    jumps = random.Random(0)
    now = iter(itertools.accumulate(jumps.uniform(0, 5) for _ in itertools.count()))
    monkeypatch.setattr(width_planner.time, "perf_counter", lambda: next(now))
    assert caps(lambda rows, drafting: 1.0 + 0.1 * rows + 0.5 * drafting) == middling
    assert not any(setup.runner.planner.gap.gaps)
