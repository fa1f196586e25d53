"""Speculation widths chosen per step by load: before each step every request gets the number of drafts to forward
(0: a plain AR step for it) that maximises the step's expected committed tokens per second; where no request waits
for a place in the batch, at its slowest request's pace (`WidthPlanner.others_wait`).

Two inputs, both measured in the serving process: what a step costs as a function of its rows (`StepCost`, fitted
from the engine's own recent step times) and how far each request's drafts get accepted (`AcceptanceTable`, per
draft position and conditional on the positions before it, with the method's recent requests as the prior). The
plan is a greedy marginal allocation over the batch's (request, position) pairs in one sort, deterministic given
those inputs, so a test can drive it with a fixed `StepCost`. Lossless methods' output does not depend on it.

Its arrays are numpy's: a plan is a few dozen operations on arrays of a batch's size, run every step beside the
forward, and numpy's operation costs about a microsecond where torch's, in a serving process whose torch runs
several threads, costs ten (0.6 ms a step at batch 1 on the 2-core CPU, measured: docs/adaptive-widths.md).
"""

import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from parallel_decoding.common.errors import require


def check_step_cost(step_cost: object) -> None:
    """A method config's `step_cost`: None (measured) or three or four seconds >= 0 (per step, per row, per drafting
    step, and per draft row: a row past a request's first; 0 where left out)."""
    require(step_cost is None or (isinstance(step_cost, list | tuple) and len(step_cost) in (3, 4)
                                  and all(isinstance(v, int | float) and v >= 0 for v in step_cost)
                                  and step_cost[0] > 0),
            "step_cost", "null or [seconds per step > 0, per row >= 0, per drafting step >= 0(, per draft row >= 0)]",
            step_cost)


Coefficients = tuple[float, float, float, float]  # seconds per step, per row, per drafting step, per draft row


def coefficients(given: Sequence[float]) -> Coefficients:
    """Three or four coefficients as four (no cost per draft row where three are given)."""
    values = tuple(float(v) for v in given)
    return (*values, 0.0) if len(values) == 3 else values  # type: ignore[return-value]


@dataclass(frozen=True)
class Shape:
    """How a method's step spends rows on drafts: `extra_forward`, a draft forward of its own with `[seed, mask x w]`
    per drafting request (linear `diffusion_self`); `mask_slots`, the next step's w drafts drawn from w + 1 mask
    slots in the verify forward itself, 2 (w + 1) rows (`wedlm_spec`); `quadratic`, w drafts cost (w + 1)(w + 3)
    rows in one forward (quadratic `diffusion_self`: a chain of w + 1, a group of w + 2 per chain token; the chain
    alone at w = 0); `branches`, that many branches of w drafts on average beside the main ones in the same forward,
    1 + (1 + branches) w rows (Jacobi's rejection recycling: as many as its pool has candidates for, measured by
    `WidthPlanner.branched`); `uniform`, every request forwards the
    batch's widest window (an engine whose verify layout is rectangular, SGLang's)."""

    extra_forward: bool = False
    mask_slots: bool = False
    quadratic: bool = False
    branches: float = 0.0
    uniform: bool = False

    def rows(self, widths: Any) -> np.ndarray:
        """Rows a request forwards (in all of its step's forwards) at each width, in a step like the last."""
        widths = np.asarray(widths, dtype=np.float64)
        if self.quadratic:
            return np.where(widths > 0, (widths + 1) * (widths + 3), 1.0)
        linear = (1 + widths) * (1 + ((self.extra_forward or self.mask_slots) & (widths > 0)))
        return linear + self.branches * widths


class StepCost:
    """Seconds of a step as `base + per_row * rows + per_drafting * drafting + per_draft_row * draft_rows`, least
    squares (none below 0: `_nonnegative`) over the last `window` measured steps plus a prior worth `prior_weight`
    steps at the measured scale,
    which settles what the steps seen cannot (all of one width). `drafting` is 1 for a step that verifies drafts:
    what it costs beyond its rows, a draft forward of its own (linear `diffusion_self`) or the engine's path for
    windows instead of its plain decode step. `draft_rows` are the rows past each request's first (its drafts in the
    verify forward, its draft forward's): what they cost beyond a decode row's. A decode row and a draft row are not
    alike: vLLM on CPU, SmolLM2, 2026-12-04, a decode row cost 0.8 ms and a draft row 1.4-1.6 ms, and a fit with one
    cost per row that learnt drafting from steps drafting for one request priced steps drafting for 3-5 at 0.5-0.9
    of their time (docs/benchmarks.md, 2026-12-02 and 2026-12-04). Steps drafting for one request alone (batch 1)
    cannot tell a draft row's cost from a drafting step's; the prior splits it, and the first steps drafting for
    several requests show it. The prior: a wide step of 16 rows costs 1.4x one row, a draft row no more than a
    decode row (as on a GPU, where a plan that priced them dearer would not draft for several requests to learn
    otherwise), a drafting step a base more with a draft forward (`PRIOR`), a quarter of one without
    (`PRIOR_ONE_FORWARD`). `fixed` coefficients (three, or four with the draft row's) are used as given and never
    refitted (tests, reproducing a run), and taken as `exact` unless told otherwise (the prior standing in for a
    measured cost is a guess, not a measurement). The fit is redone as steps come in, every `REFIT_EVERY` of them
    once there are enough (a step's planning should cost next to nothing beside a GPU's forward), and at once after
    a step of a kind (plain or drafting) of whose rows it has fewer than `SCARCE` behind it: such a step is what the
    plan waits for (`WidthPlanner.PLAIN_PROBES`). Where `skips_cold` (an engine's, `planner_for`), the first step of
    each kind and row count is left out: it runs cold (new shapes for the kernels; vLLM on CPU, tiny checkpoints: up
    to 1.5x what the same step takes after), and a plan priced by a cold drafting step holds every request at plain
    steps, which never measure drafting again, until the window drops it (vLLM, tiny NLD checkpoint, batch 1,
    2026-12-01: 128 plain steps with a drafting step fitted at 11 ms over a plain one, 4-5 ms warm;
    docs/adaptive-widths.md). The last `SCARCE` plain steps stay in the fit for `PLAIN_KEPT_FOR` steps, past the
    window: where nearly every step drafts (batch 1), the window lost them every ~130 steps, and the plan then took
    plain steps again to price one (`WidthPlanner.PLAIN_PROBES`): Jacobi on the tiny checkpoint, vLLM, batch 1,
    2026-12-02: plain in 5.8% of its steps, its pinned width in the 1.8% that start a request. Drafting steps are
    not kept: a plan held at plain steps by a few slow ones kept past the window (a process slowed from outside)
    never measured drafting again (2026-12-02, docs/adaptive-widths.md)."""

    PRIOR = (1.0, 0.025, 1.0, 0.0)  # base, per row, per drafting step, per draft row; in units of the base
    PRIOR_ONE_FORWARD = (1.0, 0.025, 0.25, 0.0)
    REFIT_EVERY = 16
    SIMILAR = 1.5
    SCARCE = 4
    PLAIN_KEPT_FOR = 512

    def __init__(self, fixed: Sequence[float] | None = None, window: int = 128, prior_weight: float = 4.0,
                 prior: Sequence[float] = PRIOR, exact: bool | None = None, skips_cold: bool = False) -> None:
        self.fixed = None if fixed is None else coefficients(fixed)
        self.exact = fixed is not None if exact is None else exact
        self.prior = coefficients(prior)
        self.steps: deque[tuple[float, float, float, float]] = deque(maxlen=window)  # rows, drafting, draft rows, s
        self.observed = 0  # steps in `steps` so far, in all
        self.plain: deque[tuple[int, float, float]] = deque(maxlen=self.SCARCE)  # the last plain ones: index, rows, s
        self.prior_weight = prior_weight
        self._fit: Coefficients | None = None
        self.unfitted = 0  # steps observed since the last fit
        self._rows = (np.zeros(0), np.zeros(0))  # rows of the measured (plain, drafting) steps behind the fit, sorted
        self._support_of: dict[tuple[int, bool], int] = {}  # `_supported`, for the current fit
        self.skips_cold = skips_cold
        self.warm: set[tuple[int, int]] = set()  # (rows, drafting) of the kinds of step run once already

    def observe(self, rows: int, drafting: int, seconds: float, requests: int | None = None) -> None:
        """One step of `requests` that forwarded `rows` in all, verifying drafts or not (`drafting`), took `seconds`
        (not counted where it is the first of its kind and rows and the fit `skips_cold`). Without `requests`: a
        plain step of a request a row, a drafting step of one request."""
        if self.fixed is None and rows > 0 and seconds > 0:
            if self.skips_cold and (shape := (int(rows), int(drafting))) not in self.warm:
                self.warm.add(shape)
                return
            scarce = self._fit is not None and self._supported(rows, bool(drafting)) < self.SCARCE
            requests = (1 if drafting else rows) if requests is None else requests
            self.steps.append((float(rows), float(bool(drafting)), float(max(rows - requests, 0)), seconds))
            self.observed += 1
            if not drafting:
                self.plain.append((self.observed, float(rows), seconds))
            self.unfitted += 1
            if scarce or 2 * self.unfitted >= min(len(self.steps), 2 * self.REFIT_EVERY):
                self._fit = None

    @property
    def coefficients(self) -> Coefficients:
        """(seconds per step, per row, per drafting step, per draft row); the prior's shape at unit scale before any
        step."""
        return self.fixed if self.fixed is not None else self._current()

    def support(self, rows: Any, drafting: bool = True) -> np.ndarray:
        """For steps of each of `rows`: how many measured drafting (or plain) steps behind the fit had within `SIMILAR`
        times as many rows (none for fixed coefficients): how far the fit has seen what it predicts such a step to
        cost."""
        rows = np.asarray(rows, dtype=np.float64)
        if self.fixed is not None:
            return np.zeros(rows.shape, dtype=np.int64)
        self._current()
        seen = self._rows[int(drafting)]
        return np.searchsorted(seen, rows * self.SIMILAR, "right") - np.searchsorted(seen, rows / self.SIMILAR, "left")

    def reach(self, rows: Any) -> np.ndarray:
        """For drafting steps of each of `rows`: how many times `SIMILAR` times the widest measured drafting step behind
        the fit they forward (1 within it, where none was measured or for fixed coefficients): how far the fit
        extrapolates a drafting step's cost."""
        rows = np.asarray(rows, dtype=np.float64)
        if self.fixed is not None:
            return np.ones(rows.shape)
        self._current()
        seen = self._rows[1]
        return np.maximum(rows / (self.SIMILAR * seen[-1]), 1.0) if len(seen) else np.ones(rows.shape)

    def _supported(self, rows: int, drafting: bool) -> int:
        """`support` of one step's rows, remembered until the next fit: a loaded engine's steps repeat their rows,
        and each is observed."""
        key = rows, drafting
        if key not in self._support_of:
            self._support_of[key] = int(self.support(rows, drafting))
        return self._support_of[key]

    def _current(self) -> Coefficients:
        if self._fit is None:
            steps = self.measured()
            self._fit, self.unfitted = self.fitted(steps), 0
            self._rows = np.sort(steps[steps[:, 1] == 0, 0]), np.sort(steps[steps[:, 1] > 0, 0])
            self._support_of.clear()
        return self._fit

    def predict(self, rows: Any, drafting: Any, draft_rows: Any = 0.0) -> Any:
        """Predicted seconds of steps forwarding `rows`, `draft_rows` of them past a request's first, verifying
        drafts where `drafting` is 1."""
        base, per_row, per_drafting, per_draft_row = self.coefficients
        return base + per_row * rows + per_drafting * drafting + per_draft_row * draft_rows

    def measured(self) -> np.ndarray:
        """[steps, (rows, drafting, draft rows, seconds)] behind the fit: the window's, and the last plain steps past it
        for up to `PLAIN_KEPT_FOR` steps."""
        steps = np.array(self.steps, dtype=np.float64).reshape(-1, 4)
        past = self.observed - len(self.steps)  # the index of the last step out of the window
        kept = [(rows, 0.0, 0.0, seconds) for index, rows, seconds in self.plain
                if self.observed - self.PLAIN_KEPT_FOR < index <= past]
        return np.concatenate([np.array(kept), steps]) if kept else steps

    def fitted(self, steps: np.ndarray | None = None) -> Coefficients:
        """The coefficients fitted to `steps` (`measured()` by default) and the prior."""
        steps = self.measured() if steps is None else steps
        if not len(steps):
            return self.prior
        design = np.concatenate([np.ones((len(steps), 1)), steps[:, :3]], 1)
        seconds = steps[:, 3]
        prior = np.array(self.prior, dtype=np.float64)
        ratios = np.sort(seconds / (design @ prior))
        scale = float(ratios[(len(ratios) - 1) // 2])  # the lower median
        # The prior as pseudo-steps: one row, 64 rows, one row in a drafting step, 17 rows in one drafting for 16.
        pseudo = np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 64.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 17.0, 1.0, 16.0]])
        target = np.concatenate([seconds, scale * pseudo @ prior])
        weights = np.concatenate([np.ones_like(seconds), np.full(len(pseudo), self.prior_weight / len(pseudo))])
        root = np.sqrt(weights)[:, None]
        solution = self._nonnegative(np.concatenate([design, pseudo]) * root, target * root[:, 0])
        base = max(float(solution[0]), 1e-3 * scale)
        return base, *(float(value) for value in solution[1:])  # type: ignore[return-value]

    @staticmethod
    def _nonnegative(design: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Least squares with every coefficient but the first (the base) at least 0: a coefficient the unconstrained fit
        makes negative is held at 0 and the others refitted without it, as often as one is. Clipping it to 0 alone
        kept what the others made up for it. At batch 1, where every drafting step drafts for one request, the prior
        (a drafting step a base more) and the steps (less) fitted a draft row below 0: vLLM's SmolLM2 costs
        (`test_draft_rows_are_priced_apart_from_decode_rows`) priced a drafting step 1.26x its time; scattered step
        times of linear `diffusion_self` (drafting steps of 6-16 rows) 1.2x, holding its plan at plain steps for a
        hundred steps (`scripts.replay_widths`, 2026-12-06)."""
        free = np.ones(design.shape[1], dtype=bool)
        while True:
            solution = np.zeros(design.shape[1])
            solution[free] = np.linalg.lstsq(design[:, free], target, rcond=None)[0]
            negative = np.flatnonzero(solution[1:] < 0) + 1
            if not len(negative):
                return solution
            free[negative[np.argmin(solution[negative])]] = False


class StepGap:
    """What a decode step costs outside the part an engine's hooks time: the engine's own scheduling, its output
    processing and the hand-over between its processes, from one step's end to the next one's start where the batch
    runs on (the same requests in the same order, so the engine waited for none): the median of the last `window` such
    gaps. A plan that prices the timed part alone undercounts a step's fixed cost, hence what the tokens of a wider
    step save (vLLM, tiny checkpoints, 2026-12-01: 0.3-1.0 ms a step beside timed steps of 3.5-5 ms; what it changed
    in the bench is within the VM's spread, docs/adaptive-widths.md). Kept per kind of the step that ended (plain,
    drafting): an engine's path around a step may differ by kind (SGLang runs a steady plain step as its own decode
    step and a drafting one through its speculative path, about 1 ms more a step on the tiny checkpoints, 2026-12-05),
    and one median taken mostly from plain steps would price drafting below its cost. A kind with no gap measured yet
    is priced by the other's."""

    def __init__(self, window: int = 32) -> None:
        self.gaps: tuple[deque[float], deque[float]] = deque(maxlen=window), deque(maxlen=window)  # plain, drafting
        self.medians = [0.0, 0.0]
        self._ended: tuple[float, tuple[str, ...], int] | None = None  # the last measured step's end, batch, kind

    def seconds_for(self, drafting: int) -> float:
        """The median gap after steps of a kind (drafting or plain), the other kind's where none was measured."""
        kind = int(bool(drafting))
        return self.medians[kind] if self.gaps[kind] else self.medians[1 - kind]

    @property
    def seconds(self) -> float:
        """The median gap after plain steps (`seconds_for`)."""
        return self.seconds_for(0)

    def began(self, keys: Sequence[str]) -> None:
        """A step of the requests `keys` begins."""
        ended, self._ended = self._ended, None
        if ended is not None and tuple(keys) == ended[1]:
            gaps = self.gaps[ended[2]]
            gaps.append(time.perf_counter() - ended[0])
            self.medians[ended[2]] = statistics.median(gaps)

    def ended(self, keys: Sequence[str], drafting: int = 0) -> None:
        """A measured decode step of the requests `keys` ends, one that verified drafts or not (`drafting`)."""
        self._ended = time.perf_counter(), tuple(keys), int(bool(drafting))


class AcceptanceTable:
    """Per request and draft position: how often the position was verified and accepted (recent steps weigh more,
    by `decay` per step of the request), read as a conditional acceptance rate shrunk towards the method's own rate
    over its recent requests (`prior_strength` steps' worth), itself starting from an optimistic `initial`
    (`initial_strength` steps' worth: with 2, a process's first verification accepting nothing put the method at
    0.53, and that request and the next at batch 1 took 122 plain steps each, neither drafting again; quadratic
    `diffusion_self` in vLLM, tiny checkpoint, 2026-12-01). The method weighs 8 steps against a request's own 10 at
    most (decay 0.9): a step's acceptance is bursty (Jacobi's windows accept nothing for several steps, then 5 to 7
    drafts at once), and a request read from its last few steps alone was held at no draft after every run of
    failures, its drafts going stale (batch 1: 0.92x the fixed width against 1.03x with this prior, 2026-11-30,
    docs/adaptive-widths.md).

    Evidence also fades while a request does not draft (`tick`, once a planned step: every `FORGET_EVERY` of them
    the counts of requests that verified nothing since are decayed as many steps), and the method's own while none
    drafts: a request held at no draft returns to the method's rate and is tried again where that pays, instead of
    staying at no draft for good on what its first drafts did (Jacobi's drafts improve as they are iterated)."""

    FORGET_EVERY = 8

    def __init__(self, max_width: int, prior_strength: float = 8.0, decay: float = 0.9, initial: float = 0.8,
                 method_decay: float = 0.995, initial_strength: float = 8.0) -> None:
        self.max_width = max_width
        self.prior_strength, self.decay, self.method_decay = prior_strength, decay, method_decay
        self.initial, self.initial_strength = initial, initial_strength
        self.slots: dict[str, int] = {}
        self.free: list[int] = []
        self.counts = np.zeros((0, 2, max_width))  # [slot, (tried, accepted), position]
        self.method = np.zeros((2, max_width))
        self.version = 0  # counts every change to the rates of requests already seen
        self.drafted = np.zeros(0, dtype=bool)  # per slot: verified a draft since the last forgetting
        self.ticks = 0
        self.positions = np.arange(max_width)
        self._rates: tuple[tuple[tuple[str, ...], int], np.ndarray] | None = None  # the last `rates`: keys, version

    def slot(self, key: str) -> int:
        if key not in self.slots:
            if not self.free:
                grown = max(8, 2 * len(self.counts))
                self.free = list(range(grown - 1, len(self.counts) - 1, -1))
                self.counts = np.concatenate([self.counts, np.zeros((grown - len(self.counts), 2, self.max_width))])
                self.drafted = np.concatenate([self.drafted, np.zeros(grown - len(self.drafted), dtype=bool)])
            self.slots[key] = index = self.free.pop()
            self.counts[index] = 0
            self.drafted[index] = False
        return self.slots[key]

    def rates(self, keys: list[str]) -> np.ndarray:
        """[len(keys), max_width] conditional acceptance rates (read-only: the last ones are kept for the same keys
        until a change, since a step's verification weighs its drafts by the rates its plan read)."""
        asked = tuple(keys), self.version
        if self._rates is not None and self._rates[0] == asked:
            return self._rates[1]
        tried, accepted = self.method
        strength = self.prior_strength
        method_rate = (accepted + self.initial_strength * self.initial) / (tried + self.initial_strength)
        slots = [self.slot(key) for key in keys]  # first: a new key may grow the table
        counts = self.counts[slots]
        rates = (counts[:, 1] + strength * method_rate) / (counts[:, 0] + strength)
        rates.flags.writeable = False
        self._rates = asked, rates
        return rates

    def record(self, keys: list[str], verified: Any, accepted: Any) -> None:
        """Steps of the requests `keys`, in order (`verified`, `accepted`: [steps, len(keys)], or one step's
        [len(keys)]): in each, each request verified `verified` drafts and accepted the first `accepted` of them. A
        step in which none drafted changes nothing; one in which a request drafted is a step of its decay."""
        verified = np.minimum(np.atleast_2d(np.asarray(verified, dtype=np.int64)), self.max_width)
        accepted = np.minimum(np.atleast_2d(np.asarray(accepted, dtype=np.int64)), verified)
        drafting = verified > 0  # [step, request]
        if not drafting.any():
            return
        positions = self.positions
        step = np.stack([positions < np.minimum(accepted + 1, verified)[..., None],
                         positions < accepted[..., None]], 2).astype(np.float64)  # [step, request, (tried, acc.), pos.]
        later = drafting[::-1].cumsum(0)[::-1] - drafting  # each request's drafting steps after each step
        weights = np.where(drafting, self.decay**later, 0.0)
        rows = drafting.any(0)
        slots = np.array([self.slot(key) for key in keys], dtype=np.int64)[rows]
        decayed = self.counts[slots] * (self.decay ** drafting.sum(0)[rows])[:, None, None]
        self.counts[slots] = decayed + np.einsum("nb,nbkw->bkw", weights, step)[rows]
        self.drafted[slots] = True
        active = drafting.any(1)  # the steps in which any request drafted: each a step of the method's decay
        method_weights = np.where(active, self.method_decay ** (active[::-1].cumsum()[::-1] - active), 0.0)
        self.method = self.method * self.method_decay ** int(active.sum()) \
            + np.einsum("n,nkw->kw", method_weights, step.sum(1))
        self.version += 1

    def drafting(self, keys: list[str]) -> None:
        """The requests `keys` verified drafts since the last forgetting, their steps not yet recorded (`tick`)."""
        for key in keys:
            self.drafted[self.slot(key)] = True

    def tick(self) -> None:
        """A step was planned; every `FORGET_EVERY` of them, what requests that verified nothing since (and the
        method, where none did) had shown fades by as many steps' decay."""
        self.ticks += 1
        if self.ticks % self.FORGET_EVERY:
            return
        drafted = bool(self.drafted.any())
        if not drafted:  # all idle, as under load held at plain steps: the whole table at once
            if bool(self.counts.any()):
                self.counts *= self.decay**self.FORGET_EVERY
                self.version += 1
        elif bool(self.counts[idle := ~self.drafted].any()):
            self.counts[idle] *= self.decay**self.FORGET_EVERY
            self.version += 1
        if not drafted and bool(self.method.any()):
            self.method *= self.method_decay**self.FORGET_EVERY
            self.version += 1
        self.drafted[:] = False

    def forget(self, keys: list[str] | set[str]) -> None:
        for key in keys:
            if (index := self.slots.pop(key, None)) is not None:
                self.free.append(index)
                self.version += 1


@dataclass
class PlannerStats:
    """What the planner chose so far: steps planned, steps with no draft at all (plain AR), drafts planned."""

    steps: int = 0
    ar_steps: int = 0
    drafts: int = 0

    @property
    def ar_share(self) -> float:
        return self.ar_steps / self.steps if self.steps else 0.0


REPORT_EVERY_S = 10.0


def planner_for(config: Any, uniform: bool = False, measured: bool = True) -> "WidthPlanner | None":
    """The planner of a method whose config adapts its widths (`adapts`), with its `step_cost` if fixed; else None.
    Its widths and their rows are the config's (`planned_width`, `shape`), alike in the reference runner and both
    engines; `uniform` where every request forwards the batch's widest window (SGLang's rectangular layout).

    Not `measured` (workers that each plan the same batch, tensor or pipeline parallel, whose plans must agree and
    whose timings differ): without a `step_cost` the prior's shape is the cost model, never refitted, so the plan
    is a function of the requests' acceptance, which every worker sees alike (and plans with the margin a measured
    cost gets: the prior is not exact)."""
    if not getattr(config, "adapts", False):
        return None
    shape = config.shape(uniform)
    prior = StepCost.PRIOR if shape.extra_forward else StepCost.PRIOR_ONE_FORWARD
    if config.step_cost is not None:
        cost = StepCost(config.step_cost, prior=prior)
    elif not measured:
        cost = StepCost(prior, prior=prior, exact=False)
    else:
        cost = StepCost(prior=prior, skips_cold=True)
    return WidthPlanner(config.planned_width, shape, cost, measured_share=True)


class WidthPlanner:
    """Drafts per request for the next step, up to `max_width` and each request's own limit (see the module)."""

    reported = 0.0
    # What a plan expects of its drafts, as a share of what the requests' recent steps say: the planner drafts for
    # the requests whose recent steps went best, which then accept less (measured: docs/adaptive-widths.md). At
    # least `EXPECTED_SHARE`, more where the drafts verified have accepted more of what the rates said
    # (`expected_share`: SGLang's quadratic `diffusion_self` at batch 1 on the tiny checkpoint, 2026-12-01, accepted
    # 0.94 of it, and a plan counting 0.8 held it at plain steps in 38% of its steps where drafting committed 1.34x a
    # plain step's tokens per second). Not less: Jacobi's drafts accept 0.53-0.88 of it, and planned by that they
    # draft less than their fixed width gains by (2026-11-30). `SHARE_PRIOR` tokens' worth of the floor to start.
    EXPECTED_SHARE = 0.8
    SHARE_PRIOR = 8.0
    SHARE_DECAY = 0.99
    # How much more a step that drafts must be expected to commit per second than a plain step, for the planner to
    # draft at all, where the cost is measured: a plan at break-even by a fitted cost loses by its errors (the main
    # job's batch of 8 on SmolLM2, 2026-11-29: the 2-6 requests left in its tail drafted at an expected 1.0x, and
    # their steps cost 1.25x what the fit said: 0.94x AR against 1.00x held at plain steps; docs/adaptive-widths.md).
    # A fixed `step_cost` is taken as exact; the prior that stands in for a measured cost where several workers plan
    # is not, and gets the margin. A step's margin holds while the fit has at most `MARGIN_SETTLED` measured drafting
    # steps of about its rows behind it, or as few plain steps of about the batch's (`StepCost.support`, `margins`),
    # and shrinks as the error of what the fit says of such steps does, with one over the root of the fewer count
    # (1.075 at 16, 1.04 at 64): where most steps draft alike
    # (batch 1) a fit from many of them is not held to a margin meant for one from a few (Jacobi on SmolLM2 at batch 1,
    # vLLM, 2026-11-30: drafting in 24% of its steps, 0.90x its fixed width's tokens per second), while a step unlike
    # those measured (a batch's tail drafting for several requests after its first drafted alone) keeps it. A step
    # past the widest drafting step measured (`StepCost.reach`) has its margin multiplied by how far past: the fit
    # learns the draft forward's cost from the steps it saw, and the main job's batch-8 tail (SmolLM2, vLLM,
    # 2026-12-02), drafting for 3-5 requests after batch 1 had measured steps drafting for one (17 rows), took 1.2-1.9x
    # what the fit said of its 39-47 rows (docs/benchmarks.md, 2026-12-02, 11:30 UTC).
    DRAFTING_MARGIN = 1.15
    MARGIN_SETTLED = 4
    # A request planned alone (batch 1) whose best drafting step is expected to beat a plain step, but by less than
    # its margin, takes that drafting step while the fit has measured at least `MARGIN_SETTLED` drafting steps of about
    # its rows but fewer than plain steps of the batch's, and the plain step otherwise. The margin holds while the
    # fewer of the two counts is small, and at batch 1 the plain count stayed at the `PLAIN_PROBES` a plan takes first:
    # a plan gaining less than 1.15x by the fit never drafted, or flipped with the step times' spread (linear
    # `diffusion_self` replayed at a spread of 0.3: 0.956x its pinned width, 37% plain). Taking the fewer kind
    # measures the margin away (1.075 at 16 each): 0.99-1.00x there (2026-12-07, docs/adaptive-widths.md). Not on fewer
    # drafting steps than `MARGIN_SETTLED`: such a fit prices drafting mostly by the prior, and where drafting does
    # not pay (a slow CPU's SmolLM2-like costs in the replay) the plans that drafted by it cost 2% of plain steps'
    # rate. Only alone: a batch's tail drafting for several requests is unlike the steps measured (`StepCost.reach`).
    EXPLORES_ALONE = True
    # Where the cost is measured, a step drafts only once the fit has measured this many plain steps of about the
    # batch's rows (the plan takes them first): a fit from drafting steps alone prices a plain step by the prior's
    # shape, which a margin cannot cover (SmolLM2 in SGLang at batch 1, 2026-11-30: a plain step priced at 100 ms
    # where it took 73 while two requests drafted every step; the next request then drafted 22 of its 23 steps at
    # 0.92x a plain step's tokens per second, each plan expecting 1.3-1.7x).
    PLAIN_PROBES = 4
    # A request a plan gave drafts whose step then told no verification (it verified none: one back from plain steps
    # first lays its drafts in a step that verifies none, quadratic `diffusion_self` and `wedlm_spec`; Jacobi's stale
    # drafts are not learnt from) keeps at least as many drafts in the plans after, for up to `UNTOLD_STEPS` such
    # steps in a row: a plan redone on that first step's cost alone held it at no draft again before any of its
    # drafts were verified, run after run (SGLang's quadratic `diffusion_self`, tiny checkpoint, batch 1, 2026-12-01:
    # a step laying drafts, then 128 plain steps, over and over, where its fixed width ran 1.42x AR;
    # docs/adaptive-widths.md).
    UNTOLD_STEPS = 3
    BRANCHES_DECAY = 0.95
    # Among plans that draft, the widest whose expected rate is within `WIDER_WITHIN` of the best one's, not the best
    # itself: near its best the rate hardly moves with the width, and what decides there is what the fit cannot see.
    # A step's cost is linear in its rows only on average (kernels pad rows to tiles, CUDA graphs to the captured
    # sizes: vLLM on CPU, tiny NLD checkpoint, batch 1, 2026-12-01, a drafting step of 16 rows took 11.4 ms and one of
    # 14 rows 12.3), and the rates of late positions rest on the few verifications that reached them. Linear
    # `diffusion_self` there expected 0.240 tokens a millisecond of its configured 7 drafts and of 4 alike, and drafted
    # 4 to 6 in most steps where its pinned width drafts 7; a loss of at most this share by the plan's own estimate. A
    # request's drafts only: one the best plan holds at no draft stays there (its rates say least of all).
    WIDER_WITHIN = 0.02
    # A plan stands for up to `REPLAN_EVERY` steps of the same batch (each request's limit no higher than it was
    # planned for, clipped to it), and the verifications recorded meanwhile are taken in at once when it is redone:
    # planning and recording each step cost 0.31 ms in vLLM's worker at batch 1 (0.18 and 0.13 ms; numpy's operations
    # there cost several times what they do in a process of its own), 7% of Jacobi's 4.5 ms steps on the tiny
    # checkpoint, where a run planning exactly the drafts of its pinned width (the same drafts, accepted tokens and
    # steps) ran 0.94x its speed; standing for 8 steps, 0.12 ms (2026-12-02, docs/adaptive-widths.md).
    REPLAN_EVERY = 8
    # A plan plain for every request of its batch, made where the measured cost had seen plain steps like it
    # (`PLAIN_PROBES`), stands longer: for `REPLAN_EVERY` steps per request of the batch, at most `PLAIN_STANDS`,
    # whatever faded or was refitted meanwhile (each of which redid it at once before). Under load nearly every step
    # is such a step (an engine's steady batch, `plain_again`), and redoing the plan and the fit as they came (every
    # 8 and 16 steps) cost 0.45 ms each time right after a forward, where caches are cold (SGLang's scheduler, tiny
    # checkpoints, batch 8, 2026-12-06: 0.06 ms of a plain step's 3.5, 2% of AR's throughput); a batch's load
    # changes more slowly than that, and a batch of one still looks again every 8 steps.
    PLAIN_STANDS = 32
    # A plan drafting every request's whole limit, made where the cost is measured and expected to commit at least
    # `CRUISE_RATE` times a plain step's tokens per second (its score, margin and all, in `_best`), stands for
    # `CRUISE_STEPS` steps of its batch, through refits and the verifications recorded meanwhile (taken in at once
    # when it is redone): where drafting pays that much, a plan redone every few steps comes out the same, and
    # redoing it cost what a pinned width does not pay (Jacobi on the tiny checkpoint, vLLM, batch 1, 2026-12-07: it
    # planned its pinned width's drafts but in a request's first and last steps, the planner took 0.16 ms of a 3.3
    # ms step in the worker, a plan was redone every 5.7 steps, and it ran 0.93x its pinned width's tokens per
    # second; with this, 1.00x; docs/adaptive-widths.md). A batch that changes (a request finished or joined, a
    # limit higher than planned for) redoes it at once, as any plan; the fit is not redone meanwhile (0.03 ms a step
    # there, a refit every 16 steps). Only on a fit that has measured at least `CRUISE_SUPPORT` drafting steps of
    # about the plan's rows: a plan priced by the prior (drafting a quarter of a base dearer than a plain step
    # without a draft forward of its own) drafts at once, and where drafting costs more than that, it must be redone
    # soon (Jacobi under a slow CPU's SmolLM2-like costs in `scripts.replay_widths`: 0.90x plain steps' rate
    # cruising from such plans against 0.97x).
    CRUISE_RATE = 1.5
    CRUISE_STEPS = 32
    CRUISE_SUPPORT = 16
    # Where no request waits for a place in the batch (`others_wait` false: the engine's queue is empty, as in a
    # batch that runs to its end), a step that drafts must also be expected to speed up each request in it that may
    # draft: its slowest one's tokens per second against a plain step's (`_fair`). Then no request frees a place
    # for another by finishing sooner, the batch's time is its slowest request's, and a plan scored by the step's
    # tokens per second alone drafted for the requests whose drafts went best while the others paid for the wider
    # step: Jacobi on the tiny checkpoint in vLLM at batch 8 (2026-12-07) drafted in 81% of its steps, each
    # expecting 1.1x a plain step's tokens per second, but the slowest request of each batch committed 1.2 tokens a
    # step at 1.6-1.9x a plain step's cost, and the batches ran 0.82x AR (docs/adaptive-widths.md). Not under a
    # fixed `step_cost` (tests, a run reproduced): its plans are the step's tokens per second alone, so that a test's
    # scripted costs give the widths that vary per request it means to give in a batch that runs to its end.
    # The slowest request's tokens a drafting step are the least of what the rates expect of each and of what the
    # slowest of as many requests realised (`realised`: each finished request's tokens per drafting step over its
    # life, the last `REALISED_KEPT`, from `REALISED_STEPS` drafting steps on): the rates of a batch's requests are
    # shrunk towards the method's, which its fast requests set, and overstate its slowest one (Jacobi, above: the
    # rates said 2 tokens a step for every request of the batch while its slowest realised 1.2; held to the rates
    # alone, its plans still drafted for whole batches in 19% of its steps, 0.77x AR in one run).
    others_wait = True
    REALISED_KEPT = 64
    REALISED_STEPS = 4
    # Where the cost is measured and what recently finished requests realised a drafting step (`realised`, their
    # mean, for each request a step drafts for) would pay for none of a plan's candidate drafting steps at their
    # fitted costs, by `UNPAID_MARGIN` against a plain step's tokens per second, the plan is plain whatever the
    # requests' rates expect: the rates of positions that a request's drafts seldom reach rest on the method's prior,
    # and where its first draft is seldom accepted they expect of the later ones what nothing measured. `jacobi` on
    # SmolLM2 in SGLang at batch 1 (2026-12-07): the rates expected 0.83 extra tokens a drafting step (positions 2-8
    # at 0.7-0.8; 0.36 and 0.5 measured at 2 and 3, on the 11 and 4 of 171 steps that reached them), the steps
    # accepted 0.11, and drafting in 41% of its steps at 0.76x a plain step's tokens per second it ran 0.90x AR. The
    # share a plan counts (`expected_share`) cannot make up for it: it is held at least `EXPECTED_SHARE`, below which
    # `jacobi` and linear `diffusion_self` on the tiny checkpoints drafted less than their pinned widths gained by
    # (replayed with a floor of 0.1: 0.955x and 0.952x their pinned widths, against 0.996x and 1.001x). Only beyond
    # the margin: the realised mean is of all of a request's drafting steps, and a plan drafting at its good moments
    # may pay where the mean does not (`wedlm_spec` on the tiny checkpoint replayed at a spread of 0.3: 0.988x the
    # better of plain and pinned steps vetoed at the mean, 1.005x as before with the margin; with the steps that
    # verified none counted, below, 1.029x, and 0.981x at no spread, against 1.054x before). A step given drafts that
    # verified none (Jacobi's stale drafts, mask slots laid first) counts among a request's drafting steps, as one
    # token: without it, that `jacobi` realised 1.2-1.3 tokens a step, within the margin of its narrowest drafting
    # step's price (1.34x a plain step's), and still drafted in 56% of its steps (0.93x AR); with it, 1.01x AR, 90%
    # plain. Only while the last request that realised anything finished within `UNPAID_WITHIN` requests: a veto that
    # a few unlucky requests set lifts, and the next request that drafts measures again.
    UNPAID_WITHIN = 16
    UNPAID_MARGIN = 1.1

    def __init__(self, max_width: int, shape: Shape = Shape(), cost: StepCost | None = None,
                 acceptance: AcceptanceTable | None = None, measured_share: bool = False) -> None:
        require(isinstance(max_width, int) and max_width >= 1, "max_width", "a positive integer", max_width)
        self.max_width = max_width
        self.shape = shape
        self.branches = shape.branches  # the branches' measured mean (`branched`)
        self.cost = cost or StepCost()
        self._acceptance = acceptance or AcceptanceTable(max_width)
        self.stats = PlannerStats()
        self.gap = StepGap()
        self.marginal_rows = np.diff(shape.rows(np.arange(max_width + 1)))  # rows each draft position adds
        self._last: tuple[tuple, np.ndarray, int, int] | None = None  # inputs, widths, AR step, drafts
        self._ticked = False  # whether this step's tick is done (`plain_again`)
        self._reused = 0  # steps the last plan stood for since it was made or found unchanged (`_stands`)
        self._plain_settled = False  # whether the last plan is plain where plain steps like it were measured
        self._cruising = False  # whether the last plan drafts every request's limit at `CRUISE_RATE` (`_cruises`)
        self._best_over_plain = 1.0  # the last plan's expected tokens per second over a plain step's (`_best`)
        self._pending: list[tuple[tuple[str, ...], list[int], list[int], list[int]]] = []  # keys, told, got, fresh
        self.untold: dict[str, tuple[int, int]] = {}  # per request given drafts: its steps told nothing since, width
        self.measured_share = measured_share  # the engines' planners (`planner_for`); else `EXPECTED_SHARE` as is
        self._share_sums = np.array([self.SHARE_PRIOR * self.EXPECTED_SHARE, self.SHARE_PRIOR])  # accepted, expected
        self._expected_share = self._share()
        self._lives: dict[str, list[int]] = {}  # per request: its drafting steps and the tokens they committed
        self.realised: deque[float] = deque(maxlen=self.REALISED_KEPT)  # finished requests' tokens a drafting step
        self.finished = 0  # requests forgotten so far
        self.realised_at = 0  # `finished` when the last one was `realised`

    @property
    def acceptance(self) -> AcceptanceTable:
        """The requests' acceptance, every step recorded so far in it (`record` leaves them to the next plan)."""
        self._settle()
        return self._acceptance

    @property
    def expected_share(self) -> float:
        """The share of the rates' expected tokens a plan counts (`_share`), every step recorded so far in it."""
        self._settle()
        return self._expected_share

    @property
    def share_sums(self) -> np.ndarray:
        """What verified drafts accepted and what the rates expected of them (`_calibrate`), recent steps weighing
        more."""
        self._settle()
        return self._share_sums

    def branched(self, counts: list[int]) -> None:
        """The recycled branches each drafting request's forward carried this step (a `Shape` with `branches`): their
        mean over recent drafting requests (`BRANCHES_DECAY` a request) prices the next plans' branches, reshaped
        where it moved by a quarter of a branch (a plan is redone only then)."""
        for count in counts:
            self.branches += (1.0 - self.BRANCHES_DECAY) * (count - self.branches)
        if abs(self.branches - self.shape.branches) >= 0.25:
            self.shape = replace(self.shape, branches=self.branches)
            self.marginal_rows = np.diff(self.shape.rows(np.arange(self.max_width + 1)))
            self._last = None

    def plan(self, keys: list[str], limits: torch.Tensor | list[int], seeded: list[bool] | None = None
             ) -> torch.Tensor:
        """Widths [len(keys)], each in 0..min(max_width, its limit). A `seeded` request keeps its limit while the
        cost is measured: its draws, hence its tokens under sampling, must not depend on this process's timings
        (with a fixed `StepCost` the plan is a function of the requests' acceptance, and seeded ones follow it)."""
        if self._ticked:
            self._ticked = False  # `plain_again` ticked for this step
        else:
            self._tick()
        limits = limits if isinstance(limits, list) else limits.tolist()
        if not keys:
            return torch.as_tensor(limits, dtype=torch.long).clamp(0, self.max_width)
        # The plan is a function of these: a step like the last (nothing verified since, no refit), as most plain
        # steps under load are, reuses it instead of recomputing it; a drafting batch's plan stands a few steps, a
        # plain one longer (`PLAIN_STANDS`), and one drafting every limit where that pays well longer still
        # (`CRUISE_STEPS`).
        batch = (list(keys), limits, None if seeded is None else list(seeded), self._kept(keys))
        if self._cruises(batch) or self._stands_plain(batch):
            pass
        elif not self._pending and self._last is not None and self._last[0] == (*batch, *self._state):
            self._reused = 0
        elif not self._stands(batch):
            self._settle()
            if self._last is None or self._last[0] != (*batch, *self._state):
                self._plan_anew(*batch)
            self._reused = 0
        _, widths, ar_step, drafts = self._last
        if drafts or self.untold:
            self._count_untold(keys, widths)
        self.stats.steps += 1
        self.stats.ar_steps += ar_step
        self.stats.drafts += drafts
        return torch.from_numpy(widths.copy())

    def plain_again(self, keys: list[str] | None = None, limits: list[int] | None = None) -> bool:
        """Plan a step for the last plan's batch without being given it again, and say whether it is a plain step for
        every request, counted; the batch (its requests, their limits) must be the last plan's, which was plain: as
        given, or as the caller vouches (an engine's batch held at no draft, every request paused: no per-request
        work to build it). Limits lower than the plan's are the same batch where lower limits keep a plain plan plain
        (`lower_limits_stay_plain`): the limits shrink in a request's last steps, as it nears its most tokens, and
        each such step would otherwise leave the engine's steady path (SGLang's `wedlm_spec`, window 16: 15 of
        a 64-token request's steps). Where it drafts, nothing is counted and `plan` follows for the same step, given
        the batch."""
        last = self._last
        if last is None or not last[2] or (keys is not None and keys != last[0][0]):
            return False
        if limits is not None and limits != last[0][1] and not (
                self.lower_limits_stay_plain and len(limits) == len(last[0][1])
                and all(new <= old for new, old in zip(limits, last[0][1], strict=True))):
            return False
        self._tick()
        if not self._stands_plain((last[0][0], last[0][1] if limits is None else limits, last[0][2], None)):
            self._settle()
            if last[0][4:] != self._state and self._plan_anew(*last[0][:4]).any():
                self._ticked = True  # `plan` follows for this step
                return False
            self._reused = 0
        self.stats.steps += 1
        self.stats.ar_steps += 1
        return True

    @property
    def lower_limits_stay_plain(self) -> bool:
        """Whether a plan that is plain for every request stays plain under lower limits, all else alike: lower limits
        take drafts' gains away and leave each candidate step's rows as they were, where every request forwards one
        width (`uniform`) or each draft adds the same rows wherever it lies (no draft forward, mask slots or quadratic
        groups, whose first draft costs more rows than the next: a plan for fewer requests' drafts may cost fewer)."""
        shape = self.shape
        return shape.uniform or not (shape.quadratic or shape.extra_forward or shape.mask_slots)

    @property
    def _state(self) -> tuple:
        """What a plan depends on beside its batch: the rates, the share it expects (stale drafts move it, not the
        rates), the cost model and whether requests wait (`others_wait`)."""
        return self._acceptance.version, self._expected_share, self.cost.coefficients, self.others_wait

    def _tick(self) -> None:
        """`AcceptanceTable.tick`; where it forgets, the requests whose verifications wait to be taken in count as
        having drafted (they did: what they showed does not fade)."""
        if self._pending and (self._acceptance.ticks + 1) % self._acceptance.FORGET_EVERY == 0:
            for keys, _, _, fresh in self._pending:
                self._acceptance.drafting([key for key, count in zip(keys, fresh, strict=True) if count])
        self._acceptance.tick()

    def _stands(self, batch: tuple) -> bool:
        """Whether the last plan stands for this step as it was made, for at most `REPLAN_EVERY` steps (whatever was
        recorded or faded since): the batch it `_holds` for, the cost model as it was (a refit, at once after a plain
        probe, `PLAIN_PROBES`, redoes it) and whether requests wait (`others_wait`)."""
        last = self._last
        if last is None or self._reused >= self.REPLAN_EVERY - 1:
            return False
        return last[0][6:] == self._state[2:] and self._holds(batch)  # the cost model, `others_wait`

    def _cruises(self, batch: tuple) -> bool:
        """Whether the last plan, drafting every request's limit at `CRUISE_RATE`, stands for this step
        (`CRUISE_STEPS`), through refits: the batch it `_holds` for."""
        last = self._last
        if last is None or not self._cruising or self._reused >= self.CRUISE_STEPS - 1:
            return False
        return self._holds(batch)

    def _holds(self, batch: tuple) -> bool:
        """Whether the last plan holds for `batch` (the same requests, seeded alike, none with a higher limit than
        planned for nor keeping more drafts than it gives, `UNTOLD_STEPS`), standing one more step if so, clipped to
        lower limits (`_stood`)."""
        if not self._within(batch):
            return False
        kept = batch[3]
        if kept is not None and any(floor > width for floor, width in zip(kept, self._last[1].tolist(), strict=True)):
            return False
        self._stood(batch)
        return True

    def _stands_plain(self, batch: tuple) -> bool:
        """Whether the last plan, plain for every request where the measured cost had seen plain steps like it, stands
        for this step (`PLAIN_STANDS`): the same requests, seeded alike, none keeping drafts or with verifications
        waiting, none with a higher limit than planned for, and requests waiting or not as they were
        (`others_wait`); lower limits kept as the plan's."""
        last = self._last
        if last is None or not last[2] or not self._plain_settled or self._pending or batch[3] is not None \
                or self._reused >= min(self.REPLAN_EVERY * len(batch[0]), self.PLAIN_STANDS) - 1 \
                or last[0][-1] != self.others_wait or not self._within(batch):
            return False
        self._stood(batch)
        return True

    def _within(self, batch: tuple) -> bool:
        """Whether `batch` is the last plan's requests, seeded alike, none with a higher limit than planned for."""
        inputs = self._last[0]
        keys, limits, seeded, _ = batch
        return keys == inputs[0] and seeded == inputs[2] and (
            limits == inputs[1] or all(new <= old for new, old in zip(limits, inputs[1], strict=True)))

    def _stood(self, batch: tuple) -> None:
        """The last plan stands for one more step of `batch` (`_within` it), clipped to its limits where lower."""
        self._reused += 1
        last = self._last
        inputs = last[0]
        if batch[1] != inputs[1]:
            widths = np.minimum(last[1], np.maximum(np.array(batch[1], dtype=np.int64), 0))
            self._last = (*batch, *inputs[4:]), widths, int(not widths.any()), int(widths.sum())

    def _kept(self, keys: list[str]) -> tuple[int, ...] | None:
        """The least width each request keeps (`UNTOLD_STEPS`), None where none keeps any."""
        if not self.untold:
            return None
        held = [self.untold.get(key, (0, 0)) for key in keys]
        kept = tuple(width if 0 < steps <= self.UNTOLD_STEPS else 0 for steps, width in held)
        return kept if any(kept) else None

    def _count_untold(self, keys: list[str], widths: np.ndarray) -> None:
        """Remember the requests this plan gives drafts (with their steps told nothing so far), forget the rest."""
        for key, width in zip(keys, widths.tolist(), strict=True):
            if width:
                self.untold[key] = (self.untold.get(key, (0, 0))[0], width)
            else:
                self.untold.pop(key, None)

    def _plan_anew(self, keys: list[str], limits: list[int], seeded: list[bool] | None,
                   kept: tuple[int, ...] | None) -> np.ndarray:
        """Plan the batch from the acceptance and cost as they stand, kept as the last plan with its inputs."""
        capped = np.minimum(np.maximum(np.array(limits, dtype=np.int64), 0), self.max_width)
        widths = self._planned(keys, capped, seeded, kept)
        inputs = (keys, limits, seeded, kept, *self._state)
        self._last = inputs, widths, int(not widths.any()), int(widths.sum())
        self._plain_settled = not widths.any() and self.cost.fixed is None and int(self.cost.support(
            float(self.shape.rows(np.zeros(len(keys))).sum()), drafting=False)) >= self.PLAIN_PROBES
        self._cruising = self.cost.fixed is None and self._best_over_plain >= self.CRUISE_RATE and bool(
            (widths == capped).all() and capped.all()) and int(self.cost.support(
                float(self.shape.rows(widths).sum()))) >= self.CRUISE_SUPPORT
        return widths

    def _planned(self, keys: list[str], limits: Any, seeded: list[bool] | None,
                 kept: tuple[int, ...] | None) -> np.ndarray:
        limits = np.asarray(limits, dtype=np.int64)
        gains = self._expected_share * self._acceptance.rates(keys).cumprod(1)  # expected extra tokens per position
        gains = np.where(self._acceptance.positions < limits[:, None], gains, 0.0)
        if self.shape.mask_slots:
            gains = self._laid_anew(gains)
        widths = self._uniform(gains) if self.shape.uniform else self._ragged(gains)
        if kept is not None:
            widths = np.maximum(widths, np.array(kept, dtype=np.int64))
        widths = np.minimum(widths, limits)
        if seeded is not None and self.cost.fixed is None:
            widths = np.where(seeded, limits, widths)
        return widths

    @staticmethod
    def _laid_anew(gains: np.ndarray) -> np.ndarray:
        """Expected extra tokens per position of steps drafting from mask slots (`Shape.mask_slots`, `wedlm_spec`): a
        step has drafts to verify only where the step before accepted all of its own; after a rejection it lays its
        slots afresh and verifies none. Of steps drafting w, a share 1 / (2 - P) verify, P the chance that all w are
        accepted (the expected gain of the w-th position), so w drafts gain G(w) / (2 - P) a step, G(w) what a step
        verifying them gains. Per position: the increments of that, made non-increasing (never more than the
        position before gains), as the plans' allocation takes them. Counting each step as verifying its drafts, the
        plan drafted at batch 1 where every other step laid slots and verified none, 0.83-0.88x AR (SGLang, tiny
        checkpoint, 2026-12-06)."""
        total = gains.cumsum(1) / (2.0 - np.minimum(gains, 1.0))
        increments = np.diff(total, axis=1, prepend=0.0)
        return np.maximum(np.minimum.accumulate(increments, axis=1), 0.0)

    def _ragged(self, gains: np.ndarray) -> np.ndarray:
        """The best count n of (request, position) pairs, taken in decreasing gain (per row, where a position's rows
        grow with it: quadratic); within a request the order never falls, so the pairs taken are each request's
        leading positions."""
        batch, width = gains.shape
        marginal = self.marginal_rows
        key = gains / marginal if self.shape.quadratic else gains
        order = np.argsort(-key.ravel(), kind="stable")
        tokens = batch + np.concatenate([[0.0], gains.ravel()[order].cumsum()])  # taking the first n pairs
        rows = batch + np.concatenate([[0.0], marginal[order % width].cumsum()])
        seconds = self.cost.predict(rows, np.arange(batch * width + 1) > 0, rows - batch)
        useful = 1 + int(np.count_nonzero(key.ravel() > 0))  # pairs that gain anything come first
        owners = order[: useful - 1] // width
        rates = tokens[:useful] / seconds[:useful]
        if self._unpaid_vetoes:
            first = np.zeros(useful - 1)
            first[np.unique(owners, return_index=True)[1]] = 1.0  # a pair that makes its request draft
            rates = self._unpaid(rates, batch, np.concatenate([[0.0], first.cumsum()]), seconds[:useful])
        if self._paced and batch > 1:
            extra = np.zeros((useful, batch))  # each plan's pair beyond the one before: its request's expected tokens
            extra[np.arange(1, useful), owners] = gains.ravel()[order[: useful - 1]]
            rates = self._fair(rates, extra.cumsum(0), gains, seconds[:useful])

        def drafting(best: int) -> np.ndarray:  # the plans that add pairs only to requests the best one drafts for
            taken = np.zeros(batch, dtype=bool)
            taken[owners[:best]] = True
            return np.concatenate([np.ones(best + 1, dtype=bool), np.logical_and.accumulate(taken[owners[best:]])])

        best = self._best(rates, rows[:useful], drafting, alone=batch == 1)
        return np.bincount(order[:best] // width, minlength=batch)

    def _uniform(self, gains: np.ndarray) -> np.ndarray:
        """One width w for the whole batch, every request forwarding 1 + w rows (and as many drafting)."""
        batch, width = gains.shape
        w = np.arange(width + 1)
        gained = gains.sum(0)  # never rising with the position
        useful = 1 + int(np.count_nonzero(gained > 0))
        tokens = batch + np.concatenate([[0.0], gained.cumsum()])[:useful]
        rows = batch * self.shape.rows(w[:useful])
        seconds = self.cost.predict(rows, w[:useful] > 0, rows - batch)
        rates = tokens / seconds
        if self._unpaid_vetoes:
            rates = self._unpaid(rates, batch, np.where(w[:useful] > 0, float(np.count_nonzero(gains[:, 0] > 0)), 0.0),
                                 seconds)
        if self._paced and batch > 1:
            taken = np.concatenate([np.zeros((1, batch)), gains.cumsum(1).T])[:useful]
            rates = self._fair(rates, taken, gains, seconds)
        return np.full(batch, self._best(rates, rows, alone=batch == 1), dtype=np.int64)

    @property
    def _paced(self) -> bool:
        """Whether plans are held to the slowest request's pace (`others_wait` false, the cost measured)."""
        return not self.others_wait and self.cost.fixed is None

    @property
    def realised_mean(self) -> float:
        """The mean of what recently finished requests realised a drafting step (`realised`; none: NaN)."""
        return float(np.mean(self.realised)) if self.realised else float("nan")

    @property
    def _unpaid_vetoes(self) -> bool:
        """Whether plans are held to what recently finished requests realised (`UNPAID_WITHIN`, `_unpaid`)."""
        return self.cost.fixed is None and bool(self.realised) and self.finished - self.realised_at < self.UNPAID_WITHIN

    def _unpaid(self, rates: np.ndarray, batch: int, drafters: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """Candidate plans' tokens per second (`rates`; index 0 the plain step of `batch` requests), the drafting ones
        (for `drafters` requests each) held to what they would commit at the mean of `realised` tokens a drafting step
        where that is below the plain step's rate for every one of them (`UNPAID_WITHIN`): then none beats the plain
        step. Where one would pay (the narrowest, as a rule: the realised tokens are mostly of wider steps), the rates
        stand: a request's drafts pay at some moments and not at others, and a plan drafting at the good ones may pay
        where the mean step does not (`UNPAID_MARGIN`)."""
        realisable = (batch + drafters * (self.realised_mean - 1.0)) / seconds
        return np.minimum(rates, realisable) if (self.UNPAID_MARGIN * realisable[1:] < rates[0]).all() else rates

    def _fair(self, rates: np.ndarray, taken: np.ndarray, gains: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """Candidate plans' tokens per second (`rates`; index 0 the plain step), none above what the batch would
        commit at its slowest request's pace (`others_wait` false): `taken` [plan, request], each request's expected
        extra tokens in each plan, and no more than the slowest of as many realised (`slowest_realised`). Only
        requests that may draft (a first position that gains) count: one at its last token, say, cannot be sped up,
        and finishes in the step either way."""
        may = gains[:, 0] > 0
        if not may.any():
            return rates
        slowest = np.minimum(1.0 + taken[:, may].min(1), self.slowest_realised(int(may.sum())))
        return np.minimum(rates, len(gains) * slowest / seconds)

    def margins(self, rows: Any, plain_rows: float) -> np.ndarray:
        """For drafting steps of each of `rows`, against a plain step of `plain_rows`: how much more than the plain step
        they must be expected to commit per second (`DRAFTING_MARGIN`, shrinking with the fewer of the measured
        drafting steps of about as many rows and the measured plain steps of about `plain_rows`; 1 under an exact
        cost). The plain steps count too: a fit from drafting steps alone (batch 1, where nearly every step drafts)
        knows what a plain step costs only from the prior's shape, and where that is wrong, drafting looks better
        than it is, and but for the plain steps a plan takes first (`PLAIN_PROBES`) the plain step that would show it
        is never taken (SGLang's quadratic `diffusion_self` on SmolLM2, 2026-11-30: drafting in 93% of its steps at
        0.91x AR, its fit's plain step 1.6x the measured one)."""
        rows = np.asarray(rows, dtype=np.float64)
        if self.cost.exact:
            return np.ones(rows.shape)
        support = np.minimum(self.cost.support(rows), self.cost.support(plain_rows, drafting=False))
        settled = self.MARGIN_SETTLED / np.maximum(support, self.MARGIN_SETTLED)
        return (1.0 + (self.DRAFTING_MARGIN - 1.0) * np.sqrt(settled)) * self.cost.reach(rows)

    def _best(self, rates: np.ndarray, rows: np.ndarray,
              widening: Callable[[int], np.ndarray] | None = None, alone: bool = False) -> int:
        """The index of the best of `rates` (tokens per second of steps of `rows`, with more rows at each index; index 0
        the plain step), each drafting step's discounted by its margin; where that is a drafting step, the last within
        `WIDER_WITHIN` of it (and among those `widening(best)` allows). The plain step while the measured cost has seen
        fewer than `PLAIN_PROBES` like it. A request planned `alone` whose best drafting step beats the plain one, but
        not by its margin, takes it while the fit has measured at least `MARGIN_SETTLED` such drafting steps and fewer
        than plain ones (`EXPLORES_ALONE`)."""
        margins = self.margins(rows, float(rows[0]))
        margins[0] = 1.0
        scores = rates / margins
        best = int(np.argmax(scores))
        self._best_over_plain = 1.0
        if self.cost.fixed is None:
            plain = int(self.cost.support(rows[0], drafting=False))
            if plain < self.PLAIN_PROBES:
                return 0
            if not best and alone and self.EXPLORES_ALONE:  # the fewer kind of step taken inside the margin
                scores = rates
                best = int(np.argmax(scores))
                if best and not self.MARGIN_SETTLED <= int(self.cost.support(rows[best])) < plain:
                    return 0
        if best:  # the widest drafting plan within `WIDER_WITHIN` of the best (of those `widening` allows)
            within = scores >= (1.0 - self.WIDER_WITHIN) * scores[best]
            best = int(np.flatnonzero(within if widening is None else within & widening(best))[-1])
            self._best_over_plain = float(scores[best] / scores[0])
        return best

    def began(self, keys: Sequence[str]) -> None:
        """A step of the requests `keys` begins (`StepGap`; an engine's hook, at every step)."""
        self.gap.began(keys)

    def observe(self, rows: int, drafting: int, seconds: float, keys: Sequence[str] | None = None
                ) -> dict[str, float] | None:
        """A measured decode step of the requests `keys` for the cost model (`StepCost.observe`), its timed `seconds`
        and what such a step costs outside them (`StepGap`, where the engine tells `began` and `keys`); `describe()`
        when a report is due (every `REPORT_EVERY_S`), for the engine's log."""
        self.cost.observe(rows, drafting, seconds + self.gap.seconds_for(drafting), None if keys is None else len(keys))
        if keys is not None:
            self.gap.ended(keys, drafting)
        now = time.monotonic()
        if now - self.reported < REPORT_EVERY_S:
            return None
        self.reported = now
        return self.describe()

    def describe(self) -> dict[str, float]:
        """What the planner chose and the cost model it chose by, for logs, metrics and the bench."""
        base, per_row, per_drafting, per_draft_row = self.cost.coefficients
        described = {"steps": self.stats.steps, "ar_share": round(self.stats.ar_share, 4),
                     "drafts_per_step": round(self.stats.drafts / max(self.stats.steps, 1), 3),
                     "step_ms": round(1e3 * base, 3), "row_ms": round(1e3 * per_row, 4),
                     "drafting_step_ms": round(1e3 * per_drafting, 3), "draft_row_ms": round(1e3 * per_draft_row, 4),
                     "measured_steps": len(self.cost.steps),
                     "outside_ms": round(1e3 * self.gap.seconds, 3),
                     "drafting_outside_ms": round(1e3 * self.gap.seconds_for(1), 3),
                     "expected_share": round(self.expected_share, 3), "others_wait": int(self.others_wait)}
        if self.realised:
            described["realised"] = round(self.realised_mean, 3)
        if self.branches:
            described["branches"] = round(self.branches, 3)  # the recycled branches a drafting forward carries
        return described

    def record(self, keys: list[str], verified: torch.Tensor | list[int], accepted: torch.Tensor | list[int],
               iterated: list[bool] | None = None) -> None:
        """The step's verification: drafts verified and accepted per request; not learnt from where the drafts were
        not `iterated` (`Decoder.iterated`: stale drafts only refresh), though what they accepted of what the rates
        expected counts towards the share a plan expects (`expected_share`): the plan paid for them as for any. Taken
        into the acceptance when a plan is next redone, with the steps recorded since the last one, at most
        `REPLAN_EVERY` (`CRUISE_STEPS` under a plan that stands that long; each weighed by the rates the plan that
        stood for it read)."""
        told = verified.tolist() if isinstance(verified, torch.Tensor) else [int(n) for n in verified]
        fresh = told if iterated is None else [n if it else 0 for n, it in zip(told, iterated, strict=True)]
        if self.untold:  # a request given drafts: told (forgotten here) or one more step told nothing (`UNTOLD_STEPS`)
            for key, count, verified_now in zip(keys, fresh, told, strict=True):
                if key in self.untold:
                    steps, width = self.untold.pop(key)
                    if not count:
                        self.untold[key] = (steps + 1, width)
                    if not verified_now:  # a drafting step all the same, of one token (`realised`)
                        life = self._lives.setdefault(key, [0, 0])
                        life[0] += 1
                        life[1] += 1
        if keys and any(told):
            got = accepted.tolist() if isinstance(accepted, torch.Tensor) else [int(n) for n in accepted]
            self._pending.append((tuple(keys), told, got, fresh))
            if len(self._pending) >= (self.CRUISE_STEPS if self._cruising else self.REPLAN_EVERY):
                self._settle()  # as many as a plan stands for: their rates are its own

    def _settle(self) -> None:
        """Take the verifications recorded since the last plan into the expected share and the acceptance, each run
        of steps of one batch at once."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for keys, run in itertools.groupby(pending, key=lambda step: step[0]):
            steps = list(run)
            told, got, fresh = (np.array([step[i] for step in steps], dtype=np.int64) for i in (1, 2, 3))
            drafted = told > 0
            for key, count, tokens in zip(keys, drafted.sum(0).tolist(), (drafted * (1 + got)).sum(0).tolist(),
                                          strict=True):
                if count:
                    life = self._lives.setdefault(key, [0, 0])
                    life[0] += count
                    life[1] += tokens
            if self.measured_share:
                self._calibrate(list(keys), told, got)
            if fresh.any():
                self._acceptance.record(list(keys), fresh, got)

    def _share(self) -> float:
        """The share of the rates' expected tokens a plan counts (`EXPECTED_SHARE`): where `measured_share`, what
        verified drafts accepted of what the rates expected of them (`share_sums`, recent steps weighing more), between
        `EXPECTED_SHARE` and 1. Kept as `expected_share`, which every plan reads."""
        return min(max(float(self._share_sums[0] / self._share_sums[1]), self.EXPECTED_SHARE), 1.0)

    def _calibrate(self, keys: list[str], verified: np.ndarray, accepted: np.ndarray) -> None:
        """Weigh the drafts that steps of the requests `keys` verified ([step, request]), as the rates expected them
        before them, against those accepted."""
        verified = np.minimum(verified, self.max_width)
        drafting = verified.any(1)  # the steps that verified drafts
        if not drafting.any():
            return
        verified, accepted = verified[drafting], accepted[drafting]
        rates = self._acceptance.rates(keys).cumprod(1)
        gains = np.where(self._acceptance.positions < verified[..., None], rates, 0.0).sum((1, 2))
        got = np.minimum(accepted, verified).sum(1)
        weights = self.SHARE_DECAY ** np.arange(len(verified))[::-1]
        decayed = self._share_sums * self.SHARE_DECAY ** len(verified)
        self._share_sums = decayed + np.array([weights @ got, weights @ gains])
        self._expected_share = self._share()

    def forget(self, keys: list[str] | set[str]) -> None:
        if not keys:
            return  # an engine's step that finished no request
        self._settle()
        self._acceptance.forget(keys)
        for key in keys:
            self.untold.pop(key, None)
            steps, tokens = self._lives.pop(key, (0, 0))
            self.finished += 1
            if steps >= self.REALISED_STEPS:
                self.realised.append(tokens / steps)
                self.realised_at = self.finished

    def slowest_realised(self, batch: int) -> float:
        """What the slowest of `batch` requests is expected to commit a drafting step, were they drawn from the
        recently finished ones (`realised`): the expected least of `batch` draws; infinite before any finished."""
        if not self.realised:
            return float("inf")
        values = np.sort(np.fromiter(self.realised, dtype=np.float64))
        above = (np.arange(len(values), 0, -1) / len(values)) ** batch  # the chance that the least is at least each
        return float(values @ (above - np.append(above[1:], 0.0)))


class Capped(Protocol):
    """A decoder whose drafts an engine's planner caps step by step: `verified`, its last step's drafts verified and
    accepted (not yet told to a planner); `most_drafts`, its configured width; `cap(width)` before it plans."""

    verified: tuple[int, int]
    most_drafts: int
    sampling: Any

    def cap(self, width: int) -> None: ...


def cap_widths(planner: WidthPlanner, keys: list[str], decoders: Sequence[Capped]) -> None:
    """Before decoders that plan their own forwards plan the next ones: tell the planner how each one's last
    verification went, then cap each one at the width the planner gives it (`keys` naming the engine's requests)."""
    verified = [decoder.verified for decoder in decoders]
    for decoder in decoders:
        decoder.verified = (0, 0)  # told once, also where a step does not digest the next forward
    planner.record(keys, [v for v, _ in verified], [a for _, a in verified])
    limits = [decoder.most_drafts for decoder in decoders]  # the next step clips its drafts by what remains
    seeded = [decoder.sampling.seed is not None for decoder in decoders]
    for decoder, width in zip(decoders, planner.plan(keys, limits, seeded).tolist(), strict=True):
        decoder.cap(width)
