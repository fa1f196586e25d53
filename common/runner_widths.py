"""Speculation widths chosen by load in the reference runner (`common.width_planner`), as the engines choose them:
before each step the planner caps the request's drafts at what its acceptance so far pays for at the measured cost of
the step's rows (0: a plain AR step), and the step's time and rows refit that cost. A step is the forwards up to one
that commits (linear `diffusion_self`: its draft forward and its verify forward).

The runner runs one request at a time, so it plans a batch of one. Only where the config asks for it
(`"adaptive": true`): left unset, the engines adapt and the reference runner, the oracle their tests compare with,
forwards the configured width, so its forwards do not depend on this machine's timing.
"""

import itertools
import time
from collections.abc import Callable
from typing import Any

from parallel_decoding.common.decoder import Decoder
from parallel_decoding.common.width_planner import WidthPlanner, cap_widths, planner_for
from parallel_decoding.common.window import Outcome


def reference_planner(config: Any) -> WidthPlanner | None:
    """The width planner of a lossless method's config that sets `adaptive: true` (with its `step_cost`, if fixed);
    None for any other."""
    return planner_for(config) if getattr(config, "adaptive", None) is True else None


StepClock = Callable[[int, int], float]  # a step's seconds by its rows and whether it drafted


class PlannedSteps:
    """One request's steps under `planner`: `begin` before a step's first forward, `forwarded` after each forward,
    `end` once the request is done. With a `clock`, a step's seconds are what it says of the step's rows instead of
    the time the step took (`scripts.replay_widths`: the planner under a scripted cost with scripted noise), and no
    time passes between steps (`StepGap`, which reads the machine's clock, is not told of them): the plans depend on
    the clock's answers alone."""

    _keys = itertools.count()

    def __init__(self, planner: WidthPlanner, decoder: Decoder, clock: StepClock | None = None) -> None:
        self.planner = planner
        self.decoder = decoder
        self.clock = clock
        self.key = f"reference-{next(self._keys)}"
        self.rows = 0
        self.started: float | None = None

    def begin(self) -> None:
        """Cap the step's drafts, once per step (not before a verify forward that follows its draft forward)."""
        if self.started is not None:
            return
        if self.clock is None:
            self.planner.began([self.key])
        self.started = time.perf_counter()
        cap_widths(self.planner, [self.key], [self.decoder])

    def forwarded(self, rows: int, outcome: Outcome) -> None:
        """A forward of `rows` ran; one that commits ends the step, whose time and rows the cost model learns."""
        self.rows += rows
        if not outcome.committed or self.started is None:
            return
        if self.planner.shape.branches and getattr(self.decoder, "draft_cap", None):
            self.planner.branched([self.decoder.branches_planned])
        drafting = int(self.rows > 1)
        seconds = time.perf_counter() - self.started if self.clock is None else self.clock(self.rows, drafting)
        self.planner.observe(self.rows, drafting, seconds, [self.key] if self.clock is None else None)
        self.rows, self.started = 0, None

    def end(self) -> None:
        self.planner.forget([self.key])
