"""The width planner (`common.width_planner`): the widths it gives follow the cost of rows and each request's
acceptance, deterministically; its cost model recovers a step's cost from measured steps."""

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
import torch

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.width_planner import AcceptanceTable, Shape, StepCost, WidthPlanner

KEYS = ["a", "b", "c", "d"]


def planner(cost: tuple[float, ...], shape: Shape | None = None, width: int = 8) -> WidthPlanner:
    return WidthPlanner(width, shape or Shape(), StepCost(cost))


def accepting(plan: WidthPlanner, keys: list[str], accepted: list[int], steps: int = 20) -> None:
    """Each request verified the full width and accepted `accepted` drafts, `steps` times."""
    for _ in range(steps):
        plan.record(keys, [plan.max_width] * len(keys), accepted)


def test_free_rows_take_the_full_width_within_each_limit():
    plan = planner((1.0, 0.0, 0.0))
    assert plan.plan(KEYS, [8, 8, 3, 0]).tolist() == [8, 8, 3, 0]
    assert planner((1.0, 0.0, 0.0), Shape(extra_forward=True)).plan(KEYS, [8] * 4).tolist() == [8] * 4


def test_expensive_rows_make_a_plain_ar_step():
    plan = planner((1.0, 1.0, 0.0))
    assert plan.plan(KEYS, [8] * 4).tolist() == [0] * 4
    assert plan.stats.ar_steps == plan.stats.steps == 1
    # An extra draft forward that costs more than the verify step itself is never worth it at this acceptance.
    assert planner((1.0, 0.0, 5.0), Shape(extra_forward=True)).plan(KEYS, [8] * 4).tolist() == [0] * 4


def test_a_plan_expects_less_than_the_requests_recent_steps_say(monkeypatch):
    """The requests a plan drafts for are picked for their best recent steps, which then accept less: the planner
    expects `EXPECTED_SHARE` (0.8) of their recent acceptance, so break-even drafts are not forwarded; free rows
    still take any draft."""
    widths = {}
    for per_row in (2.0, 9.0, 0.0):  # one accepted draft a step: dear rows pay at 1 token, not at 0.8
        plan = planner((1.0, per_row, 0.0))
        accepting(plan, ["a"], [1])
        widths[per_row] = plan.plan(["a"], [8]).tolist()
    assert widths == {2.0: [1], 9.0: [0], 0.0: [8]}
    monkeypatch.setattr(WidthPlanner, "EXPECTED_SHARE", 1.0)
    plan = planner((1.0, 9.0, 0.0))
    accepting(plan, ["a"], [1])
    assert plan.plan(["a"], [8]).tolist() == [1]


def test_the_share_a_plan_expects_is_measured_and_never_below_the_constant():
    """An engine's planner (`measured_share`) counts the share of the rates' expected tokens its verified drafts
    accepted: drafts accepting what the rates say are counted whole, and dear rows that a plan counting 0.8 of them
    would not pay for are taken; drafts accepting less than 0.8 of it are counted at 0.8 (Jacobi's, whose fixed width
    gains more than a plan by their measured share drafts for)."""
    widths, shares = {}, {}
    for measured in (False, True):
        for accepted in (1, 0):
            plan = WidthPlanner(8, Shape(), StepCost((1.0, 9.0, 0.0)), measured_share=measured)
            accepting(plan, ["a"], [accepted], steps=300)
            widths[measured, accepted] = plan.plan(["a"], [8]).tolist()
            shares[measured, accepted] = plan.expected_share, float(plan.share_sums[0] / plan.share_sums[1])
    # one accepted draft a step: 2 tokens for 19 s against 1 for 10 at the whole share, 1.8 for 19 at 0.8
    assert widths == {(False, 1): [0], (True, 1): [1], (False, 0): [0], (True, 0): [0]}
    assert shares[True, 1][0] > 0.9 and shares[False, 1][0] == WidthPlanner.EXPECTED_SHARE
    assert shares[True, 0][0] == WidthPlanner.EXPECTED_SHARE and shares[True, 0][1] < 0.5  # measured below: floored
    assert plan.describe()["expected_share"] == WidthPlanner.EXPECTED_SHARE


def test_a_step_drafts_only_where_it_beats_a_plain_one_by_the_margin(monkeypatch):
    """Drafting at an expected break-even loses by the measured cost's errors: where the cost is measured, the planner
    drafts only where the step is expected to commit `DRAFTING_MARGIN` (1.15x) the tokens per second of a plain
    step; under a fixed `step_cost` wherever it beats it. (The margin alone: a request alone takes drafting steps
    inside it to measure it away, `test_a_request_alone_takes_the_fewer_measured_kind_of_step_inside_its_margin`.)"""
    monkeypatch.setattr(WidthPlanner, "EXPLORES_ALONE", False)
    plans = {}
    for fixed in (True, False):
        for per_row in (0.5, 1.0, 2.0):  # one request accepting 2 drafts of 8
            cost = (1.0, per_row, 0.0)
            plan = WidthPlanner(8, Shape(), StepCost(cost) if fixed else StepCost(prior=cost))
            for _ in range(WidthPlanner.PLAIN_PROBES):  # measured: plain steps as the prior says, the plan's probes
                plan.observe(1, 0, 1.0 + per_row)
            accepting(plan, ["a"], [2])
            plans[fixed, per_row] = plan.plan(["a"], [8]).tolist()
    # its 2 drafts' expected tokens per second over a plain step's: 1.56x, 1.30x, 1.07x
    assert plans == {(True, 0.5): [2], (True, 1.0): [2], (True, 2.0): [2],
                     (False, 0.5): [2], (False, 1.0): [2], (False, 2.0): [0]}


def test_the_margin_shrinks_as_drafting_steps_like_the_plan_are_measured(monkeypatch):
    """The margin guards a fit from few drafting steps; with many of about the plan's rows behind it (batch 1, where
    most steps draft alike) it shrinks with one over the root of their count, and a step expected to commit 1.105x a
    plain one's tokens per second drafts; a fit from as few as `MARGIN_SETTLED`, or from many drafting steps of other
    sizes (a batch's first request drafting alone, before its tail drafts for several), keeps the whole margin. (The
    margin alone, as above.)"""
    monkeypatch.setattr(WidthPlanner, "EXPLORES_ALONE", False)
    plans, margins = {}, {}
    for drafting_steps, drafting_rows in ((0, 3), (4, 3), (16, 3), (64, 3), (64, 12)):
        plan = measured_planner(drafting_steps, drafting_rows, plain_steps=128 - drafting_steps)
        key = drafting_steps, drafting_rows
        plans[key], margins[key] = plan.plan(["a"], [8]).tolist(), plan.margins([3.0], 1.0)[0]
    # 2 drafts (3 rows): 1.105x a plain step's tokens per second
    assert plans == {(0, 3): [0], (4, 3): [0], (16, 3): [2], (64, 3): [2], (64, 12): [0]}
    assert margins[0, 3] == margins[4, 3] == margins[64, 12] == WidthPlanner.DRAFTING_MARGIN
    assert abs(margins[16, 3] - 1.075) < 1e-9 and abs(margins[64, 3] - 1.0375) < 1e-9
    assert planner((1.0, 2.0, 0.0)).margins([3.0], 1.0).tolist() == [1.0]  # a given cost is exact


def test_the_margin_holds_until_plain_steps_like_the_batch_are_measured():
    """A fit from drafting steps alone knows a plain step's cost only from the prior's shape, and a plan that drafts
    by it never takes the plain step that would show it wrong: the margin shrinks with the fewer of the drafting steps
    and the plain steps of the batch's rows measured, so such a batch takes plain steps until those are measured."""
    plans, margins = {}, {}
    for plain_steps, plain_rows in ((0, 1), (4, 1), (16, 1), (64, 1), (64, 4)):
        plan = measured_planner(64, 3, plain_steps, plain_rows)
        key = plain_steps, plain_rows
        plans[key], margins[key] = plan.plan(["a"], [8]).tolist(), plan.margins([3.0], 1.0)[0]
    assert plans == {(0, 1): [0], (4, 1): [0], (16, 1): [2], (64, 1): [2], (64, 4): [0]}
    assert margins[0, 1] == margins[4, 1] == margins[64, 4] == WidthPlanner.DRAFTING_MARGIN
    assert abs(margins[16, 1] - 1.075) < 1e-9 and abs(margins[64, 1] - 1.0375) < 1e-9


def test_a_drafting_step_wider_than_any_measured_has_its_margin_grow_with_how_far():
    """A fit learns a drafting step's cost from the drafting steps it measured: one drafting for several requests
    (a batch's tail, after its first request drafted alone) is priced beyond them, and took up to 1.9x what the fit
    said (the main job's tail, 2026-12-02). Past `SIMILAR` times the widest measured, the margin is multiplied by how
    far past it the step reaches; within it, or with no drafting step measured, or under a given cost, it is not."""
    plan = measured_planner(64, 3, plain_steps=64)
    assert plan.margins([3.0, 4.5, 9.0, 18.0], 1.0).tolist() == pytest.approx([1.0375, 1.0375, 2.3, 4.6])
    assert plan.cost.reach([4.5, 9.0]).tolist() == [1.0, 2.0]
    assert measured_planner(0, 3, plain_steps=64).margins([9.0], 1.0).tolist() == [1.15]
    assert planner((1.0, 2.0, 0.0)).margins([9.0], 1.0).tolist() == [1.0]
    # Cheap rows, drafting steps measured at 3 rows and plain ones at the batch's 4: four requests accepting 2 drafts
    # a step each would draft 2 apiece by the fit (12 rows, past its reach by 2.67), and take a plain step instead.
    cost = StepCost(prior=(1.0, 0.1, 0.0))
    for rows, drafting in ((3, 1), (4, 0)):
        for _ in range(64):
            cost.observe(rows, drafting, 1.0 + 0.1 * rows)
    wide = WidthPlanner(8, Shape(), cost)
    accepting(wide, KEYS, [2] * 4)
    assert wide.margins([12.0], 4.0).tolist() == pytest.approx([1.15 * 12 / 4.5])
    assert wide.plan(KEYS, [8] * 4).tolist() == [0] * 4  # with a margin of 1.15 alone: [2, 2, 2, 2]


def measured_planner(drafting_steps: int, drafting_rows: int, plain_steps: int, plain_rows: int = 1) -> WidthPlanner:
    """A planner whose cost was measured exactly as its prior says (a second and two a row), from `drafting_steps`
    of `drafting_rows` and `plain_steps` of `plain_rows`, for one request accepting 2 drafts a step."""
    cost = StepCost(prior=(1.0, 2.0, 0.0))
    for rows, drafting, steps in ((drafting_rows, 1, drafting_steps), (plain_rows, 0, plain_steps)):
        for _ in range(steps):
            cost.observe(rows, drafting, 1.0 + 2.0 * rows)
    plan = WidthPlanner(8, Shape(), cost)
    accepting(plan, ["a"], [2])
    return plan


def test_a_request_alone_takes_the_fewer_measured_kind_of_step_inside_its_margin(monkeypatch):
    """At batch 1 a plan expected to commit 1.105x a plain step's tokens per second by the fit, inside its margin
    (1.12 while the fewer of the drafting steps and plain steps measured is 6), drafts while the fit has measured at
    least `MARGIN_SETTLED` drafting steps like it but fewer than plain ones, and takes the plain step otherwise
    (`EXPLORES_ALONE`), so both counts grow and the margin shrinks; without it only the plain steps grew, and the plan
    never drafted. Fewer drafting steps than that leave the prior to price them, and a plan drafting by the prior
    needs the whole margin; where the drafting steps measured cost more than the fit's prior says, it does not draft."""
    counts = ((0, 6), (4, 6), (6, 6), (6, 16), (16, 6))
    plans = {(d, p): measured_planner(d, 3, plain_steps=p).plan(["a"], [8]).tolist() for d, p in counts}
    assert plans == {(0, 6): [0], (4, 6): [2], (6, 6): [0], (6, 16): [2], (16, 6): [0]}
    cost = StepCost(prior=(1.0, 2.0, 0.0))
    for rows, drafting, steps in ((3, 1, 6), (1, 0, 16)):
        for _ in range(steps):
            cost.observe(rows, drafting, 1.0 + 2.0 * rows + float(drafting))  # a drafting step a second dearer
    dearer = WidthPlanner(8, Shape(), cost)
    accepting(dearer, ["a"], [2])
    assert dearer.plan(["a"], [8]).tolist() == [0]  # 0.97x a plain step's tokens per second
    monkeypatch.setattr(WidthPlanner, "EXPLORES_ALONE", False)
    assert {(d, p): measured_planner(d, 3, plain_steps=p).plan(["a"], [8]).tolist() for d, p in counts} == {
        key: [0] for key in counts}


def test_the_prior_that_stands_in_for_a_measured_cost_gets_the_margin():
    """Several workers planning one batch plan by the prior's shape, a guess and not a measurement: the margin
    applies as to a measured cost, not the any-gain rule of a `step_cost` the config gives."""
    from parallel_decoding.common.methods import parse_config
    from parallel_decoding.common.width_planner import planner_for

    shared = planner_for(parse_config("jacobi", {"block_size": 8}), measured=False)
    given = planner_for(parse_config("jacobi", {"block_size": 8, "step_cost": list(shared.cost.coefficients)}))
    assert tuple(shared.cost.coefficients) == tuple(given.cost.coefficients)
    assert not shared.cost.exact and given.cost.exact
    plans = {}
    for name, plan in (("shared", shared), ("given", given)):
        for _ in range(10):  # the first draft accepted every other step
            accepting(plan, ["a", "b"], [1, 1], steps=1)
            accepting(plan, ["a", "b"], [0, 0], steps=1)
        plans[name] = plan.plan(["a", "b"], [8, 8]).tolist()
    gains = given.EXPECTED_SHARE * given.acceptance.rates(["a", "b"]).cumprod(1)
    drafting = torch.tensor(plans["given"])
    tokens = 2 + sum(float(g[:n].sum()) for g, n in zip(gains, plans["given"], strict=True))
    seconds = float(given.cost.predict(given.shape.rows(drafting).sum(), torch.ones(())))
    plain = 2 / float(given.cost.predict(torch.tensor(2.0), torch.zeros(())))
    assert 1.0 < tokens / seconds / plain < shared.DRAFTING_MARGIN  # drafting pays, by less than the margin
    assert any(plans["given"]) and plans["shared"] == [0, 0]


def test_requests_whose_drafts_fail_stop_paying_for_them():
    plan = planner((1.0, 0.05, 0.0))
    accepting(plan, ["good", "bad"], [8, 0])
    good, bad = plan.plan(["good", "bad"], [8, 8]).tolist()
    assert good == 8 and bad == 0


def fitted_planner(per_row: float, batch: int, width: int = 8) -> WidthPlanner:
    """A planner whose cost is measured (not fixed): steps of `batch` requests costing 1 + `per_row` a row, plain and
    drafting up to `width` for each, observed."""
    cost = StepCost(prior=(1.0, per_row, 0.0, 0.0), exact=True)
    for rows, drafting in [(batch, 0)] * 8 + [(batch + k, 1) for k in range(1, batch * width + 1)] * 2:
        cost.observe(rows, drafting, 1.0 + per_row * rows, requests=batch)
    return WidthPlanner(width, Shape(), cost)


def test_where_no_request_waits_a_step_drafts_only_where_it_speeds_up_its_slowest_request():
    """Where requests wait for a place in the batch (the default) a plan drafts for the requests whose drafts pay
    and holds the rest at no draft; where none wait (`others_wait` false, the cost measured) the batch runs to its
    slowest request's end, and a step drafts only where each request that may draft is expected to go faster than
    in a plain step: a request held at no draft would only be slowed by its neighbours' wider step."""
    plan = fitted_planner(0.2, batch=2)
    accepting(plan, ["good", "bad"], [8, 0])
    assert plan.plan(["good", "bad"], [8, 8]).tolist() == [8, 0]
    plan.others_wait = False
    assert plan.plan(["good", "bad"], [8, 8]).tolist() == [0, 0]
    assert plan.describe()["others_wait"] == 0
    plan.others_wait = True  # requests wait again: planned as before
    assert plan.plan(["good", "bad"], [8, 8]).tolist() == [8, 0]
    ending = fitted_planner(0.2, batch=2)  # one that cannot draft (at its last token) is not held to it
    accepting(ending, ["good", "bad"], [8, 0])
    ending.others_wait = False
    assert ending.plan(["good", "bad"], [8, 0]).tolist() == [8, 0]
    both = fitted_planner(0.2, batch=2)
    accepting(both, ["a", "b"], [8, 8])
    both.others_wait = False
    assert both.plan(["a", "b"], [8, 8]).tolist() == [8, 8]
    # The slowest of a batch is taken at no more than the slowest of as many recently finished requests realised:
    # where those committed little a drafting step, the step is plain, whatever the rates say.
    assert both.slowest_realised(2) == float("inf")
    both.realised.extend([1.0, 3.0])
    assert both.slowest_realised(1) == 2.0 and both.slowest_realised(2) == 0.75 * 1.0 + 0.25 * 3.0
    both.realised.extend([1.1] * 6)  # (taken in as requests finish, which replans: here a batch planned anew)
    assert both.plan(["b", "a"], [8, 8]).tolist() == [0, 0]
    ended = fitted_planner(0.2, batch=1)  # what a finished request realised: its tokens a drafting step
    assert "realised" not in ended.describe()
    for accepted in (3, 1, 0, 0):
        ended.record(["a"], [8], [accepted])
    ended.record(["a"], [0], [0])  # a plain step is not one of them
    ended.forget(["a"])
    assert list(ended.realised) == [(4 + 2 + 1 + 1) / 4]
    ended.record(["b"], [8], [8])  # too few drafting steps to tell
    ended.forget(["b"])
    assert list(ended.realised) == [2.0] and ended.describe()["realised"] == 2.0  # their mean, reported
    # A layout of one width for the batch alike; and a fixed cost (tests, a run reproduced) plans as before.
    uniform = fitted_planner(0.2, batch=2)
    uniform.shape = replace(uniform.shape, uniform=True)
    accepting(uniform, ["good", "bad"], [8, 0])
    assert uniform.plan(["good", "bad"], [8, 8]).tolist()[0] > 0
    uniform.others_wait = False
    assert uniform.plan(["good", "bad"], [8, 8]).tolist() == [0, 0]
    fixed = planner((1.0, 0.05, 0.0))
    accepting(fixed, ["good", "bad"], [8, 0])
    fixed.others_wait = False
    assert fixed.plan(["good", "bad"], [8, 8]).tolist() == [8, 0]


def test_drafting_that_no_step_could_pay_for_by_what_finished_requests_realised_is_not_taken():
    """Where what recently finished requests realised a drafting step would pay for none of the candidate drafting
    steps at their fitted costs (by `UNPAID_MARGIN`), the plan is plain whatever the rates expect; where it would pay
    for one, the rates decide; a veto lifts once `UNPAID_WITHIN` requests finished without realising anything."""
    paying = fitted_planner(0.2, batch=1)  # a plain step 1.2, one draft 1.4, eight 2.8
    accepting(paying, ["a"], [8])
    assert paying.plan(["a"], [8]).tolist() == [8]
    for accepted in [0] * 9 + [1]:  # a request whose drafting steps committed 1.1 tokens each: 1.1 at 1.4 against 1
        paying.record(["b"], [8], [accepted])  # at 1.2 is within the margin, and the rates decide
    paying.forget(["b"])
    assert list(paying.realised) == [1.1] and paying.plan(["c"], [8]).tolist() == [8]  # the next request
    plan = fitted_planner(0.2, batch=1)
    accepting(plan, ["a"], [8])
    for _ in range(4):  # one whose drafting steps committed 1 token each: 1 at 1.4 does not, against 1 at 1.2
        plan.record(["b"], [8], [0])
    plan.forget(["b"])
    assert list(plan.realised) == [1.0] and plan.plan(["c"], [8]).tolist() == [0]
    plan.forget([f"x{i}" for i in range(WidthPlanner.UNPAID_WITHIN - 1)])  # finished without drafting
    assert plan.plan(["d"], [8]).tolist() == [0]
    plan.forget(["y"])  # (the veto moves only as requests finish, which changes the batch)
    assert plan.plan(["z"], [8]).tolist() == [8]  # the veto lifted: drafting is measured again
    stale = fitted_planner(0.2, batch=1)  # a step given drafts that verified none is a drafting step of one token
    assert stale.plan(["s"], [8]).tolist()[0] > 0
    stale.record(["s"], [0], [0])  # (Jacobi's stale drafts, mask slots laid first)
    for _ in range(3):
        stale.record(["s"], [8], [2])
    stale.forget(["s"])
    assert list(stale.realised) == [(1 + 3 * 3) / 4]
    fixed = planner((1.2, 0.2, 0.0))  # a fixed cost (tests, a run reproduced) plans by the rates alone
    accepting(fixed, ["a"], [8])
    fixed.realised.extend([1.0] * 4)
    assert fixed.plan(["a"], [8]).tolist() == [8]


def test_width_falls_as_rows_get_dearer():
    widths = []
    for per_row in (0.0, 0.01, 0.05, 0.2, 5.0):
        plan = planner((1.0, per_row, 0.0))
        for accepted in (2, 0) * 10:  # every other step's first draft fails
            accepting(plan, KEYS, [accepted] * 4, steps=1)
        widths.append(int(plan.plan(KEYS, [8] * 4).sum()))
    assert widths == sorted(widths, reverse=True) and widths[0] == 32 and widths[-1] == 0
    assert 0 < widths[2] < 32


def test_a_uniform_layout_gives_one_width_and_pays_for_its_padding():
    plan = planner((1.0, 0.03, 0.0), Shape(uniform=True))
    accepting(plan, KEYS, [8, 8, 8, 0])
    widths = plan.plan(KEYS, [8, 8, 2, 8]).tolist()
    assert len(set(widths[:2] + widths[3:])) == 1 and widths[0] > 0 and widths[2] == min(widths[0], 2)
    ragged = planner((1.0, 0.03, 0.0))
    accepting(ragged, KEYS, [8, 8, 8, 0])
    assert ragged.plan(KEYS, [8, 8, 2, 8]).tolist()[3] == 0


def test_the_plan_is_deterministic_given_its_inputs():
    plans = []
    for _ in range(2):
        plan = planner((1.0, 0.03, 0.5), Shape(extra_forward=True))
        accepting(plan, KEYS, [5, 1, 3, 0], steps=7)
        plans.append(plan.plan(KEYS, [8, 6, 8, 8]).tolist())
    assert plans[0] == plans[1]


def test_acceptance_is_conditional_per_position_and_shrunk_to_the_method():
    table = AcceptanceTable(4, prior_strength=1.0, decay=1.0, initial=0.5)
    for _ in range(99):
        table.record(["x"], torch.tensor([4]), torch.tensor([2]))  # positions 1, 2 accepted; 3 rejected; 4 unseen
    rates = table.rates(["x", "fresh"])
    assert rates[0, 0] > 0.98 and rates[0, 1] > 0.98 and rates[0, 2] < 0.02
    assert abs(rates[0, 3] - rates[1, 3]) < 1e-9  # never verified: the method's rate
    assert rates[1, 0] > 0.9 and rates[1, 2] < 0.05  # a new request starts from the method's rates
    table.forget(["x"])
    assert "x" not in table.slots and table.rates(["x"])[0, 0] == rates[1, 0]


def test_one_failed_verification_does_not_set_the_method_against_drafting():
    """The method's rate starts optimistic with the weight of `initial_strength` verifications: one first verification
    accepting nothing leaves it above 0.7 (with 2 it fell to 0.53, and at batch 1 the next requests never drafted);
    a run of them brings it down."""
    table = AcceptanceTable(4)
    table.record(["x"], [3], [0])
    assert table.rates(["fresh"])[0, 0] > 0.7
    for _ in range(15):
        table.record(["x"], [3], [0])
    assert table.rates(["fresh"])[0, 0] < 0.4


def test_the_cost_model_fits_measured_steps():
    cost = StepCost()
    for rows in (1, 4, 8, 16, 32, 64, 9, 18) * 4:
        cost.observe(rows, 0, 0.030 + 0.0005 * rows, rows)
        for requests in {1, max(rows // 2, 1)}:  # drafting for one request, or for several with fewer draft rows
            cost.observe(rows, 1, 0.030 + 0.0005 * rows + 0.020 + 0.001 * (rows - requests), requests)
    base, per_row, per_forward, per_draft_row = cost.coefficients
    assert abs(base - 0.030) < 2e-3 and abs(per_row - 0.0005) < 1e-4 and abs(per_forward - 0.020) < 2e-3
    assert abs(per_draft_row - 0.001) < 1e-4


def test_draft_rows_are_priced_apart_from_decode_rows():
    """A step's rows past each request's first (its drafts, its draft forward's rows) cost what decode rows do not.
    From steps drafting for one request (batch 1) the fit cannot tell a draft row's cost from a drafting step's, and
    the prior's shape splits it; once a few steps drafting for several requests are measured, it prices steps
    drafting for more by their draft rows. vLLM on CPU, SmolLM2, pinned linear `diffusion_self` (2026-12-04): a
    decode row 0.8 ms, a draft row 1.4-1.6 ms; one cost per row priced steps drafting for 3-5 requests at 0.5-0.9 of
    their time (2026-12-02)."""
    truth = StepCost((0.038, 0.0008, 0.008, 0.0007))

    def seconds(rows: int, requests: int) -> float:
        return float(truth.predict(rows, rows > requests, rows - requests))

    cost = StepCost()
    for _ in range(40):
        for rows, requests in ((8, 8), (1, 1), (17, 1)):  # plain at batch 8 and 1; 8 drafts for one request
            cost.observe(rows, int(rows > requests), seconds(rows, requests), requests)
    assert abs(float(cost.predict(17, 1, 16)) / seconds(17, 1) - 1) < 0.03  # the steps measured: as they took
    ratios = [float(cost.predict(17 * n, 1, 16 * n)) / seconds(17 * n, n) for n in (3, 5, 8)]
    assert all(0.6 < ratio < 1.1 for ratio in ratios), ratios  # the prior splits it: a draft row as a decode row
    for _ in range(9):
        cost.observe(3 * 17 + 5, 1, seconds(3 * 17 + 5, 8), 8)  # the batch's tail: three of its eight draft
    ratios = [float(cost.predict(17 * n, 1, 16 * n)) / seconds(17 * n, n) for n in (3, 5, 8)]
    assert all(0.94 < ratio < 1.03 for ratio in ratios), ratios
    assert cost.coefficients[3] > 0.0003


def test_a_plan_pays_for_its_draft_rows():
    """The plan prices each candidate step's rows past a request's first by the draft row's cost, in both layouts."""
    for shape in (Shape(), Shape(uniform=True), Shape(extra_forward=True)):
        assert planner((1.0, 0.0, 0.0, 0.0), shape=shape).plan(["a", "b"], [4, 4]).tolist() == [4, 4]
        assert planner((1.0, 0.0, 0.0, 1.0), shape=shape).plan(["a", "b"], [4, 4]).tolist() == [0, 0]
    plan = WidthPlanner(4, Shape(), StepCost())
    plan.observe(10, 1, 0.05, ["a", "b"])  # told the step's requests: 8 of its 10 rows are draft rows
    plan.observe(3, 0, 0.02, ["a", "b", "c"])
    assert [tuple(step[:3]) for step in plan.cost.steps] == [(10.0, 1.0, 8.0), (3.0, 0.0, 0.0)]


def test_one_width_seen_leaves_the_slope_to_the_prior():
    cost = StepCost()
    for _ in range(50):
        cost.observe(8, 0, 0.05)
    base, per_row, *_ = cost.coefficients
    assert abs(base + 8 * per_row - 0.05) < 5e-3 and 0 < per_row < base


def test_the_fit_is_redone_every_few_steps_and_follows_a_change(monkeypatch):
    """Planned every step, the cost model is fitted after each of its first steps of a kind (`StepCost.SCARCE`),
    then every 16 new steps, not every step, and still follows the machine when its steps get slower."""
    cost = StepCost()
    fits = []
    fitted = cost.fitted
    monkeypatch.setattr(cost, "fitted", lambda *steps: fits.append(len(cost.steps)) or fitted(*steps))
    for step in range(96):
        cost.observe(8 + step % 8, 0, (0.050 if step < 48 else 0.100) + 0.001 * (step % 8))
        cost.predict(torch.tensor(8.0), torch.tensor(0.0))  # a plan reads the fit
    assert fits[:4] == [1, 2, 3, 4] and len(fits) == 11 and all(b - a == 16 for a, b in pairwise(fits[-5:]))
    base, per_row, *_ = cost.coefficients
    assert base + 8 * per_row > 0.07  # the slower half is in the last fit (the faster half's steps: 0.050-0.057)


def test_what_a_step_costs_between_steps_of_the_same_batch_is_priced(monkeypatch):
    """The engine's own work between one decode step and the next (scheduling, output, the hand-over between its
    processes) is part of every step's cost: the median gap from a measured step's end to the next step's start
    where the batch runs on is added to each measured step; a step whose batch changed (a request finished or
    joined; the engine may have waited for one) adds no gap."""
    now = [0.0]
    monkeypatch.setattr("parallel_decoding.common.width_planner.time.perf_counter", lambda: now[0])
    plan = WidthPlanner(4)
    for step in range(40):  # 3 ms timed, then 1 ms (2 ms every fourth step) before the next step of the batch
        plan.began(["a", "b"])
        now[0] += 0.003
        plan.observe(2, 0, 0.003, ["a", "b"])
        now[0] += 0.002 if step % 4 == 0 else 0.001
    assert plan.gap.seconds == pytest.approx(0.001)
    assert plan.cost.coefficients[0] + 2 * plan.cost.coefficients[1] == pytest.approx(0.004, rel=0.02)
    assert plan.describe()["outside_ms"] == 1.0
    plan.began(["a"])  # "b" finished: 30 ms since, not a gap of the batch's
    now[0] += 0.03
    plan.observe(1, 0, 0.003, ["a"])
    assert plan.gap.seconds == pytest.approx(0.001) and len(plan.gap.gaps[0]) == 32
    plan.began(["b", "a"])  # another order: not the same batch
    assert plan.gap.seconds == pytest.approx(0.001)


def test_the_gap_after_a_step_is_priced_by_the_kind_of_step(monkeypatch):
    """An engine's path around a drafting step may cost more than around a plain one (SGLang: its speculative path
    against its own decode step): a drafting step is priced with the median gap after drafting steps, a plain one with
    the gap after plain ones; before any drafting gap is measured, drafting is priced by the plain gap."""
    now = [0.0]
    monkeypatch.setattr("parallel_decoding.common.width_planner.time.perf_counter", lambda: now[0])
    plan = WidthPlanner(4)
    seen = []
    observe = plan.cost.observe
    monkeypatch.setattr(plan.cost, "observe", lambda rows, drafting, seconds, requests: seen.append(
        (drafting, round(seconds, 6))) or observe(rows, drafting, seconds, requests))
    for step in range(12):  # plain steps 1 ms apart, then drafting steps 3 ms apart
        drafting = int(step >= 6)
        plan.began(["a", "b"])
        now[0] += 0.004
        plan.observe(4 if drafting else 2, drafting, 0.004, ["a", "b"])
        now[0] += 0.003 if drafting else 0.001
    assert plan.gap.seconds_for(0) == pytest.approx(0.001) and plan.gap.seconds_for(1) == pytest.approx(0.003)
    assert seen[5] == (0, 0.005) and seen[6] == (1, 0.005)  # the first drafting step: no drafting gap yet
    assert seen[11] == (1, 0.007)  # later ones: their own kind's gap
    described = plan.describe()
    assert described["outside_ms"] == 1.0 and described["drafting_outside_ms"] == 3.0


def test_fixed_costs_are_not_refitted():
    cost = StepCost((1.0, 0.5, 0.0))
    cost.observe(8, 0, 123.0)
    assert cost.coefficients == (1.0, 0.5, 0.0, 0.0)  # three given: no cost per draft row


def test_planner_for_follows_the_config_and_reports_at_most_every_interval():
    from parallel_decoding.common.methods import parse_config
    from parallel_decoding.common.width_planner import planner_for

    assert planner_for(parse_config("jacobi", {"adaptive": False})) is None
    plan = planner_for(parse_config("jacobi", {"block_size": 4}))
    assert plan is not None and plan.cost.fixed is None and plan.measured_share
    # an engine's fit leaves out the first step of each kind and rows (it runs cold)
    assert plan.observe(8, 0, 0.05)["measured_steps"] == 0 and plan.observe(8, 0, 0.05) is None
    plan.observe(8, 1, 0.05)
    assert len(plan.cost.steps) == 1
    assert planner_for(parse_config("jacobi", {"step_cost": [1, 0, 0]})).cost.coefficients == (1, 0, 0, 0)
    four = planner_for(parse_config("jacobi", {"step_cost": [1, 0, 0, 0.5]}))
    assert four.cost.coefficients == (1, 0, 0, 0.5)  # the fourth: per draft row
    for bad in ([1, 0], [1, 0, 0, 0, 0], [1, 0, 0, -1]):
        with pytest.raises(ConfigError, match="step_cost"):
            parse_config("jacobi", {"step_cost": bad})
    # Several workers planning the same batch (tensor parallel) share the prior's cost model, never their timings.
    shared = planner_for(parse_config("jacobi", {"block_size": 4}), measured=False)
    shared.observe(8, 0, 0.05)
    assert shared.cost.coefficients == StepCost.PRIOR_ONE_FORWARD and not shared.cost.steps
    # A drafting step's prior: a base more with a draft forward of its own, a quarter of one without.
    assert planner_for(parse_config("diffusion_self", {})).cost.prior == StepCost.PRIOR
    given_shared = planner_for(parse_config("jacobi", {"step_cost": [1, 0, 0]}), measured=False)
    assert given_shared.cost.coefficients == (1, 0, 0, 0)


def test_planner_for_takes_each_methods_widths_and_rows_from_its_config():
    """One mapping from a config to its planner's widths and rows (`planned_width`, `shape`), read alike by the
    reference runner, vLLM's proposers and SGLang's workers (`uniform`: a rectangular layout)."""
    from parallel_decoding.common.methods import parse_config
    from parallel_decoding.common.width_planner import planner_for

    cases = [
        ("jacobi", {"block_size": 4, "num_blocks": 2}, 8, Shape()),
        ("jacobi", {"block_size": 4, "pool_size": 4, "verification_size": 4}, 4, Shape(branches=2.0)),
        ("jacobi", {"block_size": 4, "pool_size": 4, "recycling": "linear"}, 4, Shape()),
        ("diffusion_self", {"num_speculative_tokens": 5}, 5, Shape(extra_forward=True)),
        ("diffusion_self", {"num_speculative_tokens": 3, "mode": "quadratic"}, 3, Shape(quadratic=True)),
        ("wedlm_spec", {"window": 6}, 5, Shape(mask_slots=True)),
    ]
    for method, settings, width, shape in cases:
        for uniform in (False, True):
            plan = planner_for(parse_config(method, settings), uniform=uniform)
            assert (plan.max_width, plan.shape) == (width, replace(shape, uniform=uniform)), (method, settings)
    for method in ("wedlm", "diffusion"):  # approximate methods: no planner
        assert planner_for(parse_config(method, {})) is None


def test_a_cold_first_drafting_step_does_not_hold_an_engines_plans_at_plain_steps():
    """The first step of a kind and rows runs cold (new shapes for the kernels): an engine's planner leaves it out of
    its fit, and a drafting step that took ten plain steps' time once, cold, does not price drafting for the plans
    after it, which would then hold every request at plain steps that never measure drafting again."""
    from parallel_decoding.common.methods import parse_config
    from parallel_decoding.common.width_planner import planner_for

    plan = planner_for(parse_config("diffusion_self", {"num_speculative_tokens": 7}))
    assert plan.cost.skips_cold
    for _ in range(32):
        plan.observe(1, 0, 0.005)
    plan.observe(8, 1, 0.05)  # cold: ten plain steps' time
    accepting(plan, ["a"], [5])
    assert plan.plan(["a"], [7]).tolist()[0] >= 5  # the drafts it accepts (or more: `WIDER_WITHIN`)
    plan.cost.skips_cold = False  # the same step counted: drafting looks dear enough to hold a request plain
    plan.cost.warm.clear()
    plan.cost.observe(8, 1, 0.05)
    plan.cost.observe(8, 1, 0.05)
    accepting(plan, ["b"], [5])  # (a new batch: "a"'s plan may stand through refits, `CRUISE_STEPS`)
    assert plan.plan(["b"], [7]).tolist() == [0]


def rate(plan: WidthPlanner, gains: torch.Tensor, widths: list[int]) -> float:
    """Expected tokens per predicted second of a step giving each request its width."""
    w = torch.tensor(widths)
    tokens = len(widths) + sum(float(g[:n].sum()) for g, n in zip(gains, widths, strict=True))
    return tokens / float(plan.cost.predict(plan.shape.rows(w).sum(), torch.zeros(())))


def test_quadratic_rows_grow_with_the_square_of_the_width():
    """Quadratic self-speculation pays (w + 1)(w + 3) rows for w drafts (the chain alone at w = 0): the planner
    takes the width that maximises tokens per second among all of them, narrower than where rows grow linearly."""
    shape = Shape(quadratic=True)
    assert shape.rows(torch.arange(4)).tolist() == [1, 8, 15, 24]
    for cost in [(1.0, 0.0, 0.0), (1.0, 0.01, 0.0), (1.0, 0.03, 0.0), (1.0, 1.0, 0.0)]:
        plan = planner(cost, shape)
        accepting(plan, ["a", "b"], [8, 3])
        gains = plan.acceptance.rates(["a", "b"]).cumprod(1)
        widths = plan.plan(["a", "b"], [8, 8]).tolist()
        best = max(rate(plan, gains, [i, j]) for i in range(9) for j in range(9))
        within = 1.0 - WidthPlanner.WIDER_WITHIN  # the widest plan that close to the best
        assert rate(plan, gains, widths) >= 0.99 * within * best, (cost, widths)
        for key, gain in zip(["a", "b"], gains, strict=True):  # alone: the widest within that of the best width
            alone = plan.plan([key], [8]).tolist()
            rates = [rate(plan, gain[None], [w]) for w in range(9)]
            assert alone[0] == max(w for w in range(9) if rates[w] >= within * max(rates))
    assert planner((1.0, 0.0, 0.0), shape).plan(KEYS, [8] * 4).tolist() == [8] * 4
    assert planner((1.0, 1.0, 0.0), shape).plan(KEYS, [8] * 4).tolist() == [0] * 4
    linear, quadratic = planner((1.0, 0.01, 0.0)), planner((1.0, 0.01, 0.0), shape)
    assert 0 < quadratic.plan(KEYS, [8] * 4).max() < linear.plan(KEYS, [8] * 4).min()
    uniform = planner((1.0, 0.01, 0.0), Shape(quadratic=True, uniform=True)).plan(KEYS, [8] * 4)
    assert len(set(uniform.tolist())) == 1 and 0 < uniform[0] < 8



def test_a_plan_stands_for_a_few_steps_of_its_batch_and_takes_their_verifications_in_at_once(monkeypatch):
    """A plan stands for up to `REPLAN_EVERY` steps of its batch (clipped to a lower limit; a higher one, another
    batch, redoes it), and the verifications recorded meanwhile are taken in at once, as recording them one by one
    would: the planner's overhead at batch 1 in vLLM's worker was 7% of a Jacobi step."""
    monkeypatch.setattr(AcceptanceTable, "FORGET_EVERY", 64)  # no fading (which redoes a plan) in these steps
    plan, computed = planner((1.0, 0.1, 0.0)), []
    monkeypatch.setattr(plan, "_planned", lambda *args, planned=plan._planned: computed.append(args) or planned(*args))
    keys = ["a", "b"]
    first = plan.plan(keys, [8, 8]).tolist()
    for _ in range(WidthPlanner.REPLAN_EVERY - 1):  # "a" fails its drafts: the plan stands all the same
        plan.record(keys, first, [0, first[1]])
        assert plan.plan(keys, [8, 8]).tolist() == first and len(computed) == 1
    plan.record(keys, first, [0, first[1]])
    assert plan.plan(keys, [8, 8]).tolist()[0] < first[0] and len(computed) == 2  # redone, with what "a" showed
    widths = plan.plan(keys, [8, 8]).tolist()
    plan.record(keys, widths, [0, widths[1]])
    assert plan.plan(keys, [8, 3]).tolist() == [min(widths[0], 8), min(widths[1], 3)] and len(computed) == 2
    plan.record(keys, [0, 3], [0, 3])
    plan.plan(keys, [8, 8])
    assert len(computed) == 3  # a higher limit than planned for
    plan.record(keys, [0, 8], [0, 8])
    plan.plan(["b", "a"], [8, 8])
    assert len(computed) == 4  # another batch
    # Steps taken in at once leave the acceptance as recording them one by one does.
    generator = torch.Generator().manual_seed(0)
    verified = torch.randint(0, 9, (12, 3), generator=generator)
    accepted = torch.minimum(torch.randint(0, 9, (12, 3), generator=generator), verified)
    verified[3] = 0  # a step in which none drafted: no step of decay
    apart, together = AcceptanceTable(8), AcceptanceTable(8)
    for step in range(12):
        apart.record(["x", "y", "z"], verified[step], accepted[step])
    together.record(["x", "y", "z"], verified, accepted)
    assert np.allclose(apart.rates(["x", "y", "z"]), together.rates(["x", "y", "z"]))
    assert np.allclose(apart.method, together.method) and np.allclose(apart.counts, together.counts)


def test_a_plan_drafting_every_limit_where_that_pays_well_stands_longer(monkeypatch):
    """Where the measured cost has seen enough drafting steps like it (`CRUISE_SUPPORT`), a plan giving every request
    its whole limit and expected to commit `CRUISE_RATE` times a plain step's tokens per second stands for
    `CRUISE_STEPS` steps of its batch, through refits and failing verifications, which it then takes in at once (the
    planner's overhead was most of what Jacobi at batch 1 in vLLM paid beside its pinned width); on fewer such
    steps measured, or paying less, it stands `REPLAN_EVERY` steps as any plan; another batch redoes it at once."""
    monkeypatch.setattr(AcceptanceTable, "FORGET_EVERY", 1024)  # no fading (which redoes a plan) in these steps

    def measured(drafting_steps: int, drafting_cost: float) -> tuple[WidthPlanner, list]:
        plan, computed = WidthPlanner(8, Shape(), StepCost(), measured_share=True), []
        monkeypatch.setattr(plan, "_planned",
                            lambda *args, planned=plan._planned: computed.append(args) or planned(*args))
        for _ in range(8):
            plan.observe(1, 0, 0.01)
        for _ in range(drafting_steps):
            plan.observe(9, 1, drafting_cost)
        accepting(plan, ["a"], [8])
        return plan, computed

    for drafting_steps, drafting_cost, stands in ((WidthPlanner.CRUISE_SUPPORT, 0.015, WidthPlanner.CRUISE_STEPS),
                                                  (WidthPlanner.CRUISE_SUPPORT - 1, 0.015, WidthPlanner.REPLAN_EVERY),
                                                  (WidthPlanner.CRUISE_SUPPORT, 0.06, WidthPlanner.REPLAN_EVERY)):
        plan, computed = measured(drafting_steps, drafting_cost)
        assert plan.plan(["a"], [8]).tolist() == [8] and len(computed) == 1, (drafting_steps, drafting_cost)
        rate = plan.acceptance.rates(["a"])[0, 0]
        for step in range(1, stands):  # its drafts fail, the step is timed (refitted every 16): the plan stands
            plan.record(["a"], [8], [0])
            plan.observe(9, 1, drafting_cost, ["a"])
            assert plan.plan(["a"], [8]).tolist() == [8] and len(computed) == 1, (drafting_steps, step)
        plan.record(["a"], [8], [0])
        plan.plan(["a"], [8])
        assert len(computed) == 2 and plan.acceptance.rates(["a"])[0, 0] < rate - 0.2  # redone with what "a" showed
    plan, computed = measured(WidthPlanner.CRUISE_SUPPORT, 0.015)
    plan.plan(["a"], [8])
    accepting(plan, ["b"], [8])
    plan.plan(["a", "b"], [8, 8])
    assert len(computed) == 2  # another batch


def test_mask_slot_drafts_count_the_steps_that_lay_their_slots_afresh():
    """`wedlm_spec` verifies drafts only after a step that accepted all of its own; after a rejection a step lays its
    mask slots and verifies none. Its plans count that (`WidthPlanner._laid_anew`): where a request's first draft is
    accepted every other step (and none past it) and a drafting step costs 1.3x a plain one, a plan that took every
    step as verifying would draft (1.4 tokens expected for 1.3x), and it keeps to plain steps; where drafts are
    nearly always accepted it drafts its full width."""
    for uniform in (False, True):
        laying, verifying = (planner((1.0, 0.0, 0.3), Shape(mask_slots=mask_slots, uniform=uniform), width=4)
                             for mask_slots in (True, False))
        for plan in (laying, verifying):
            for step in range(40):
                plan.record(KEYS, [4] * len(KEYS), [step % 2] * len(KEYS))
        assert verifying.plan(KEYS, [4] * len(KEYS)).all()
        assert laying.plan(KEYS, [4] * len(KEYS)).tolist() == [0] * len(KEYS)
        sure = planner((1.0, 0.0, 0.3), Shape(mask_slots=True, uniform=uniform), width=4)
        accepting(sure, KEYS, [4] * len(KEYS), steps=40)
        assert sure.plan(KEYS, [4] * len(KEYS)).tolist() == [4] * len(KEYS)
    gains = np.array([[0.5, 0.25, 0.125, 0.0], [0.9, 0.81, 0.72, 0.65]])
    laid = WidthPlanner._laid_anew(gains)
    assert np.allclose(laid.cumsum(1)[:, [0, -1]], [[0.5 / 1.5, 0.875 / 1.875], [0.9 / 1.1, 3.08 / 1.35]])
    assert (np.diff(laid, axis=1) <= 0).all() and (laid >= 0).all() and (laid <= gains).all()


def test_a_plain_plan_under_load_stands_through_refits_and_fading(monkeypatch):
    """Once the measured cost has seen plain steps like it, a plan plain for every request stands for `REPLAN_EVERY`
    steps per request of its batch, at most `PLAIN_STANDS`, through the refits and the fading that redid it at once
    before (each 0.45 ms right after a forward in SGLang's scheduler), in `plan` and in `plain_again` alike; a plain
    plan made while the fit still lacks plain steps (`PLAIN_PROBES`) stands no longer than before, so rows that turn
    out cheap are drafted at once; a batch of one looks again every `REPLAN_EVERY` steps."""
    def measured(keys: list[str]) -> tuple[WidthPlanner, list]:
        plan, computed = WidthPlanner(8, Shape(), StepCost(), measured_share=True), []
        monkeypatch.setattr(plan, "_planned",
                            lambda *args, planned=plan._planned: computed.append(args) or planned(*args))
        for rows in [*range(1, 40), *[len(keys)] * WidthPlanner.PLAIN_PROBES]:  # drafting steps dear: a plain plan
            drafting = rows % 2 if rows > len(keys) else 0
            plan.observe(rows, drafting, 0.01 * (1 + rows) + 0.1 * drafting)
        return plan, computed

    for keys, stands in ((KEYS, min(WidthPlanner.REPLAN_EVERY * len(KEYS), WidthPlanner.PLAIN_STANDS)),
                         (["a"], WidthPlanner.REPLAN_EVERY)):
        for steady in (False, True):
            plan, computed = measured(keys)
            limits = [8] * len(keys)
            assert plan.plan(keys, limits).tolist() == [0] * len(keys) and len(computed) == 1
            for step in range(1, 3 * stands + 1):
                before = len(computed)
                if not (steady and plan.plain_again(keys, limits)):
                    assert plan.plan(keys, limits).tolist() == [0] * len(keys)
                plan.observe(len(keys), 0, 0.01 * (1 + len(keys)), keys)  # refitted every 16 steps
                assert len(computed) == before or step % stands == 0, (keys, steady, step)  # looked at again
            assert len(computed) > 1
            assert plan.stats.steps == plan.stats.ar_steps == 3 * stands + 1
    # Before any plain step was measured the plan is plain to take them; rows are cheap, and once the fit has
    # `PLAIN_PROBES` of them the next step drafts.
    probing = WidthPlanner(8, Shape(), StepCost(), measured_share=True)
    for rows in range(9, 40):
        probing.observe(rows, 1, 0.01)
    widths = [probing.plan(KEYS, [8] * len(KEYS)).tolist()]
    for _ in range(WidthPlanner.PLAIN_PROBES):
        probing.observe(len(KEYS), 0, 0.01)
        widths.append(probing.plan(KEYS, [8] * len(KEYS)).tolist())
    assert widths[:-1] == [[0] * len(KEYS)] * WidthPlanner.PLAIN_PROBES and all(widths[-1])


def test_a_step_like_the_last_reuses_its_plan_and_any_change_redoes_it(monkeypatch):
    """Plans are reused while their inputs stand (keys, limits, acceptance, measured share, cost model): through steps
    that draft or not, accept or not, verify stale drafts (the share learns from them, the rates do not), change the
    batch, refit the cost and fade idle requests' evidence, every plan equals one computed afresh; steps with nothing
    verified, no refit and no fading between them (plain steps under load, within a forgetting period) compute it
    once. (Each plan redone at every step that verified drafts: `REPLAN_EVERY` at 1.)"""
    monkeypatch.setattr(WidthPlanner, "REPLAN_EVERY", 1)
    plan = WidthPlanner(8, Shape(), StepCost(), measured_share=True)
    generator, widths_seen = torch.Generator().manual_seed(3), set()
    computed, planned = [], plan._planned
    monkeypatch.setattr(plan, "_planned", lambda *args: computed.append(args) or planned(*args))
    for step in range(240):
        keys = KEYS[: 2 + step // 80][:: 1 - 2 * ((step + 10) // 40 % 2)]  # more requests, in another order
        limits = [1 + step // 20 % 8] * len(keys)
        kept = plan._kept(keys)  # what requests whose steps told nothing keep (`UNTOLD_STEPS`), an input too
        widths = plan.plan(keys, limits)
        assert widths.tolist() == planned(keys, torch.tensor(limits), None, kept).tolist(), step
        widths_seen.add(tuple(widths.tolist()))
        accepted = torch.randint(0, 9, (len(keys),), generator=generator).minimum(widths)
        accepted = torch.where(torch.tensor([key == "a" for key in keys]), widths, accepted // 3).tolist()
        verified = widths.tolist() if step % 4 == 0 else [0] * len(keys)  # steps that verify nothing between
        plan.record(keys, verified, accepted, iterated=[step % 8 != 4] * len(keys))  # every other one stale
        rows = len(keys) + int(widths.sum())
        plan.observe(rows, 0, 0.01 * (1 + 0.002 * rows * (1 + step // 30)))
    assert len(widths_seen) >= 3 and 0 < len(computed) < 180
    plan.plan(keys, limits)
    for _ in range(WidthPlanner.UNTOLD_STEPS + 1):  # past the steps in which untold requests keep their drafts
        plan.record(keys, [0] * len(keys), [0] * len(keys))
        plan.plan(keys, limits)
    while plan.acceptance.ticks % AcceptanceTable.FORGET_EVERY:  # up to a fading, so none falls in the steps below
        plan.plan(keys, limits)
    before = len(computed)
    for _ in range(AcceptanceTable.FORGET_EVERY - 1):
        plan.record(keys, [0] * len(keys), [0] * len(keys))
        plan.plan(keys, limits)
    assert len(computed) == before
    # A step that verified stale drafts alone moves the share a plan expects, not the rates: the next plan is redone.
    fresh, redone = WidthPlanner(8, Shape(), StepCost((1.0, 9.0, 0.0)), measured_share=True), []  # plain
    monkeypatch.setattr(fresh, "_planned", lambda *args, planned=fresh._planned: redone.append(args) or planned(*args))
    fresh.plan(["a"], [8])
    fresh.plan(["a"], [8])
    fresh.record(["a"], [8], [8], iterated=[False])
    fresh.plan(["a"], [8])
    assert fresh.expected_share > WidthPlanner.EXPECTED_SHARE and len(redone) == 2


def test_a_plain_step_again_is_counted_without_planning_only_where_planning_gives_it(monkeypatch):
    """`plain_again` (an engine's steady batch, every request held at no draft) agrees with `plan` step for step: it
    counts a step only where the plan is plain for all, replanning after a verified draft, a refit of the cost and a
    fading (after which requests whose drafts all failed are tried again), and leaves the planner as planning would
    (where it declines, `plan` follows for the same step). Each plan redone at every step that verified drafts."""
    monkeypatch.setattr(WidthPlanner, "REPLAN_EVERY", 1)
    steady, planned = WidthPlanner(8, Shape(), StepCost()), WidthPlanner(8, Shape(), StepCost())
    limits, counted, declined, drafting_steps = [8] * len(KEYS), 0, 0, 0
    for plan in (steady, planned):  # a row costs a tenth of a step's base
        for rows in range(4, 40):
            plan.observe(rows, rows % 2, 0.01 * (1 + 0.1 * rows))
    for step in range(500):
        widths = planned.plan(KEYS, limits).tolist()
        if step and steady.plain_again():
            counted += 1
            assert widths == [0] * len(KEYS), step
        else:
            declined += step > 0
            assert steady.plan(KEYS, limits).tolist() == widths, step
        drafting_steps += any(widths)
        rows = len(KEYS) + sum(widths)
        # Every draft fails, but for a run of "a"'s, now and then, told as if it had drafted.
        verified, accepted = ([8, 0, 0, 0], [8, 0, 0, 0]) if step % 100 == 50 else (widths, [0] * len(KEYS))
        for plan in (steady, planned):
            plan.record(KEYS, verified, accepted)
            plan.observe(rows, int(any(widths)), 0.01 * (1 + (0.1 if step < 400 else 0.0) * rows))  # then free
    assert steady.stats == planned.stats and steady.acceptance.ticks == planned.acceptance.ticks
    assert counted > 400 and declined >= drafting_steps >= 2
    free = planner((1.0, 0.0, 0.0))
    assert free.plan(KEYS, limits).tolist() == limits and not free.plain_again()  # the last plan drafts
    dear = planner((0.01, 1.0, 1.0))
    assert dear.plan(KEYS, limits).tolist() == [0] * len(KEYS)
    assert not dear.plain_again(KEYS[:3], limits[:3]) and not dear.plain_again(KEYS, [9] * len(KEYS))  # another batch
    assert dear.plain_again(KEYS, limits) and dear.plain_again() and dear.stats.ar_steps == 3


def test_a_steady_batch_stays_steady_as_its_limits_shrink():
    """In a request's last steps its limit shrinks (it nears its most tokens); where lower limits keep a plain plan
    plain (a uniform layout, or rows a draft alike wherever it lies), `plain_again` takes such a step as the same
    batch and counts it as `plan` plans it; limits above those its plain plan was made for, or a layout whose first
    draft costs more rows than the next (a draft forward of its own, ragged), leave it to `plan`."""
    for shape in (Shape(), Shape(branches=2.0), Shape(uniform=True), Shape(uniform=True, extra_forward=True),
                  Shape(uniform=True, mask_slots=True), Shape(uniform=True, quadratic=True)):
        steady, planned = planner((0.01, 1.0, 1.0), shape), planner((0.01, 1.0, 1.0), shape)
        assert steady.plan(KEYS, [8] * len(KEYS)).tolist() == [0] * len(KEYS)
        planned.plan(KEYS, [8] * len(KEYS))
        for left in range(7, -2, -1):
            limits = [min(8, max(left + i, 0)) for i in range(len(KEYS))]
            assert planned.plan(KEYS, limits).tolist() == [0] * len(KEYS)
            assert steady.plain_again(KEYS, limits), (shape, limits)
        assert steady.stats == planned.stats
        assert not steady.plain_again(KEYS, [9] * len(KEYS))  # above the limits its plain plan was made for
    ragged = planner((0.01, 1.0, 1.0), Shape(extra_forward=True))
    assert ragged.plan(KEYS, [8] * len(KEYS)).tolist() == [0] * len(KEYS)
    assert not ragged.plain_again(KEYS, [7] * len(KEYS)) and ragged.plain_again(KEYS, [8] * len(KEYS))


def test_a_request_held_at_no_draft_is_tried_again_as_what_it_showed_fades(monkeypatch):
    """A request whose first drafts failed is held at no draft; while it drafts nothing its evidence fades towards
    the method's rate (`AcceptanceTable.tick`), so where rows are cheap it is tried again within a few forgetting
    periods (where they are dear, never), and a request that keeps drafting keeps its own rate."""
    monkeypatch.setattr(WidthPlanner, "REPLAN_EVERY", 1)  # each plan redone at every step that verified drafts
    for cost, tried in [((1.0, 0.1, 0.0), True), ((1.0, 1.0, 0.0), False)]:
        plan = planner(cost, width=4)
        for _ in range(10):  # "a" fails its drafts, "b" accepts them all
            plan.plan(["a", "b"], [4, 4])
            plan.record(["a", "b"], [4, 4], [0, 4])
        assert plan.plan(["a", "b"], [4, 4]).tolist()[0] == 0
        widths = []
        for _ in range(4 * AcceptanceTable.FORGET_EVERY):
            widths.append(plan.plan(["a", "b"], [4, 4]).tolist())
            plan.record(["a", "b"], [0, widths[-1][1]], [0, widths[-1][1]])
        assert any(a > 0 for a, _ in widths) == tried, (cost, widths)
        # "b" keeps its own rate: where rows are cheap it drafts its full width throughout; where a row costs a step's
        # base, its record (every draft accepted) is shrunk towards the method's, which "a" drags down, and holds it
        assert all(b == (4 if tried else widths[0][1]) for _, b in widths)
    table = AcceptanceTable(2, decay=0.5)
    table.record(["a"], torch.tensor([2]), torch.tensor([0]))
    for _ in range(2 * AcceptanceTable.FORGET_EVERY - 1):  # the period it drafted in, then one without
        table.tick()
    before = table.rates(["a"])
    table.tick()
    assert table.rates(["a"])[0, 0] > before[0, 0]  # a period without drafts: "a"'s failure weighs less


def test_a_drafting_step_pays_its_fixed_cost_once_per_step():
    """A step that verifies drafts costs more than its rows (the engine's path for windows, or a draft forward):
    the planner drafts only where the step's expected extra tokens pay for that once, however many requests draft."""
    for jump, drafts in [(0.5, True), (1.5, False)]:
        plan = planner((1.0, 0.0, jump))
        accepting(plan, ["a"], [1])  # its first draft lands, the rest never: about 1.1 tokens expected a step
        assert bool(plan.plan(["a"], [8]).any()) == drafts, jump
    plan = planner((1.0, 0.0, 1.0))
    accepting(plan, KEYS, [8] * 4)
    assert plan.plan(KEYS, [8] * 4).tolist() == [8] * 4


def test_drafts_not_iterated_are_not_learnt_from():
    """A step's verification of stale drafts (`Decoder.iterated` false) leaves the rates as they were; the same
    verification of iterated drafts moves them."""
    plan = planner((1.0, 0.01, 0.0))
    before = plan.acceptance.rates(["a"]).copy()
    plan.record(["a"], [4], [0], iterated=[False])
    assert (plan.acceptance.rates(["a"]) == before).all()
    plan.record(["a"], [4], [0], iterated=[True])
    assert plan.acceptance.rates(["a"])[0, 0] < before[0, 0]
    # A plan paid for stale drafts as for any: what they accepted counts towards the share it expects.
    measured = WidthPlanner(8, Shape(), StepCost((1.0, 0.01, 0.0)), measured_share=True)
    measured.record(["a"], [4], [0], iterated=[False])
    assert measured.share_sums[1] > WidthPlanner.SHARE_PRIOR and measured.share_sums[0] < WidthPlanner.SHARE_PRIOR * 0.8


def test_jacobis_shape_prices_the_rows_its_forward_carries():
    """Recycled candidates ride beside the drafts only as `branches` (up to `verification_size` of them);
    `linear` recycling puts the newest in the drafts' place, and a forward capped at w drafts carries 1 + w rows: a
    shape priced for branches there made every draft cost five rows, and SGLang's planner held Jacobi at plain steps."""
    from parallel_decoding.common.decoder import Limits
    from parallel_decoding.common.jacobi import JacobiConfig, JacobiDecoder
    from parallel_decoding.common.sampling import SamplingParams

    for recycling, pool_size in (("linear", 4), ("branches", 4), ("branches", 0)):
        config = JacobiConfig(block_size=8, pool_size=pool_size, verification_size=4, recycling=recycling)
        decoder = JacobiDecoder.resume([1, 2, 3, 4, 5], SamplingParams(), Limits(32), config)
        decoder.pool.extend([[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 9, 9, 9, 9, 9, 9, 9, 9]] if pool_size else [])
        shape = config.shape(uniform=True)
        for width in (0, 3, 8):
            decoder.cap(width)
            rows = len(decoder.plan().token_ids) - (decoder.num_tokens - decoder.cache_len - 1)  # the seed's on
            if recycling == "branches" and pool_size:
                assert rows == 1 + width + decoder.branches_planned * width and (decoder.branches_planned or not width)
            else:
                assert rows == shape.rows(width) == 1 + width, (recycling, pool_size, width, rows)


def test_the_branches_a_forward_carries_are_measured():
    """Jacobi's recycled branches are priced as many as drafting forwards carried on average (`branched`): where they
    carry one, the planner drafts where priced at the most (four) it would not, and stops again once they carry four."""
    plan = WidthPlanner(8, Shape(branches=4.0, uniform=True), StepCost((1.0, 0.2, 0.0)))
    accepting(plan, ["a"], [6])
    assert plan.plan(["a"], [8]).tolist() == [0]
    plan.branched([1] * 60)
    assert abs(plan.shape.branches - 1.0) < 0.25 and plan.plan(["a"], [8]).tolist() == [6]
    plan.branched([4] * 60)
    assert plan.shape.branches > 3.5 and plan.plan(["a"], [8]).tolist() == [0]
    assert plan.describe()["branches"] == round(plan.branches, 3)
    assert "branches" not in planner((1.0, 0.0, 0.0)).describe()


def test_a_step_drafts_only_once_plain_steps_like_the_batch_are_measured():
    """A fit from drafting steps alone prices a plain step by the prior's shape, wrong by more than any margin (the
    shape says 2 s; it takes 1 s, then 3 s): the plan takes `PLAIN_PROBES` plain steps first, each refitting the cost
    at once, and then drafts only where drafting pays by the measured plain step."""
    for plain_seconds, drafts in ((1.0, 0), (3.0, 8)):  # drafting steps cost 4 s: 4 plain steps' worth, or 1.33
        cost = StepCost(prior=(1.0, 0.0, 1.0))
        for _ in range(64):
            cost.observe(18, 1, 4.0)  # 8 drafts, 9 rows in each forward; the shape says a plain step costs 2 s
        plan = WidthPlanner(8, Shape(extra_forward=True), cost)
        accepting(plan, ["a"], [3])  # 4 tokens a drafting step
        widths = []
        for _ in range(WidthPlanner.PLAIN_PROBES + 2):
            widths.append(int(plan.plan(["a"], [8])[0]))
            rows = int(plan.shape.rows(widths[-1]))
            plan.observe(rows, int(widths[-1] > 0), 4.0 if widths[-1] else plain_seconds)
        assert widths == [0] * WidthPlanner.PLAIN_PROBES + [drafts] * 2, (plain_seconds, widths)


def test_the_last_plain_steps_stay_in_the_fit_past_its_window_for_a_while():
    """Where nearly every step drafts (batch 1), the last plain steps stay in the fit `PLAIN_KEPT_FOR` steps past its
    window, so the plan probes a plain step's cost every ~512 steps, not every ~130 (the window's length); drafting
    steps are not kept. (The old window alone: 36 plain steps in these 1,200.)"""
    plan = WidthPlanner(8, Shape(extra_forward=True), StepCost(prior=(1.0, 0.0, 1.0)))
    plain = 0
    for step in range(1200):
        width = int(plan.plan(["a"], [8])[0])
        plain += width == 0
        plan.observe(1 + 2 * width, int(width > 0), 1.2 if width else 1.0)  # drafting: 1.2 s for 4 tokens
        plan.record(["a"], [width], [min(width, 3)])
        if step == 300:  # the first probes, past the window
            cost = plan.cost
            assert len(cost.measured()) == len(cost.steps) + 4 and all(cost.measured()[:4, 1] == 0)
    assert plain == 3 * WidthPlanner.PLAIN_PROBES, plain  # at 0, 528 and 1044
    assert abs(plan.cost.predict(1, 0) - 1.0) < 0.15  # a plain step priced as measured (the prior's shape: 0.6)
    cost = StepCost(prior=(1.0, 0.0, 1.0))
    for step in range(StepCost.PLAIN_KEPT_FOR):
        cost.observe(*((1, 0, 1.0) if step < 4 else (9, 1, 2.0)))
    assert len(cost.measured()) == len(cost.steps) + 4
    cost.observe(9, 1, 2.0)
    assert len(cost.measured()) == len(cost.steps) + 3  # the first is `PLAIN_KEPT_FOR` steps old
    for _ in range(200):
        cost.observe(1, 0, 1.0)
    assert len(cost.measured()) == len(cost.steps)  # none past the window where the window has some


def test_a_request_given_drafts_keeps_them_until_a_step_of_it_is_told():
    """A request back from plain steps first lays its drafts in a step that verifies none: a plan redone on that
    step's cost alone does not hold it at no draft before its drafts are verified (for `UNTOLD_STEPS` such steps)."""
    plan = planner((1.0, 0.0, 0.0))
    assert plan.plan(["a", "b"], [4, 4]).tolist() == [4, 4]
    plan.cost.fixed = (1.0, 5.0, 0.0, 0.0)  # rows dear now: a fresh plan drafts nothing
    plan.record(["a", "b"], [0, 3], [0, 1])  # a's step laid its drafts and verified none; b's verified three
    assert plan.plan(["a", "b"], [4, 4]).tolist() == [4, 0]
    for _ in range(WidthPlanner.UNTOLD_STEPS - 1):
        plan.record(["a", "b"], [0, 0], [0, 0])
        assert plan.plan(["a", "b"], [2, 4]).tolist() == [2, 0]  # within its limit
    plan.record(["a", "b"], [0, 0], [0, 0])
    assert plan.plan(["a", "b"], [4, 4]).tolist() == [0, 0]  # as many steps told nothing: planned afresh
    plan.cost.fixed = (1.0, 0.0, 0.0, 0.0)
    assert plan.plan(["a"], [4]).tolist() == [4]
    plan.cost.fixed = (1.0, 5.0, 0.0, 0.0)
    plan.record(["a"], [4], [1])  # told: planned afresh at once
    assert plan.plan(["a"], [4]).tolist() == [0]


def test_a_request_drafts_the_widest_width_within_a_small_share_of_the_best(monkeypatch):
    """Near its best the rate hardly moves with the width: the plan takes the widest width whose expected rate is
    within `WIDER_WITHIN` of the best one's (what a fitted linear cost cannot see, padded rows, decides there), and
    only for requests the best plan drafts for."""
    shape = Shape(extra_forward=True)
    widened = 0
    for per_row in (0.0, 0.005, 0.01, 0.02, 0.04):
        plan = planner((1.0, per_row, 0.5), shape)
        for accepted in (4, 2, 6, 3) * 5:
            accepting(plan, ["a"], [accepted], steps=1)
        gains = plan.expected_share * plan.acceptance.rates(["a"]).cumprod(1)
        rates = [(1 + float(gains[0, :w].sum())) / float(plan.cost.predict(shape.rows(w), w > 0)) for w in range(9)]
        best = max(range(9), key=rates.__getitem__)
        expected = max(w for w in range(9) if rates[w] >= (1 - WidthPlanner.WIDER_WITHIN) * rates[best]) if best else 0
        assert plan.plan(["a"], [8]).tolist() == [expected], per_row
        widened += expected > best
        monkeypatch.setattr(WidthPlanner, "WIDER_WITHIN", 0.0)
        plan._last = None
        assert plan.plan(["a"], [8]).tolist() == [best]
        monkeypatch.undo()
    assert widened >= 2, widened


def test_a_coefficient_fitted_below_zero_is_held_at_zero_and_the_rest_refitted():
    """Step times that fall with a drafting step's rows (scattered times at batch 1, a request's last steps drafting
    fewer) fit a negative cost per draft row; held at 0, the others are refitted without it, so the steps measured
    most are priced about what they took (clipped alone, a 16-row drafting step here was priced 1.25x its time)."""
    cost = StepCost()
    for _ in range(20):
        cost.observe(1, 0, 0.010)
    for _ in range(60):
        cost.observe(16, 1, 0.024)
    for _ in range(20):
        cost.observe(6, 1, 0.026)
    assert min(cost.coefficients) >= 0
    assert abs(float(cost.predict(16, 1, 15)) / 0.024 - 1) < 0.05
    assert abs(float(cost.predict(1, 0)) / 0.010 - 1) < 0.05
