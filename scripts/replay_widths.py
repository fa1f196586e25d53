"""The width planner at batch 1 replayed on `common/`'s reference runner under a scripted step cost, so that what its
plans realise is read without this machine's spread: each method on its trained tiny checkpoint (greedy, the bench's
prompts), pinned to its configured width, and adaptive twice: with the cost model given exactly (`step_cost`: what
the plans make of the requests' acceptance alone) and fitted from step times that scatter about it (what an engine's
planner sees: `--noise`, the relative spread of a step's time, a third on this 2-core VM's tiny checkpoints).

    python -m scripts.replay_widths --json out/replay.json
    python -m scripts.replay_widths --methods jacobi --row-cost 0.0133 --noise 0,0.3 --seeds 5 --json out/replay.json
    python -m scripts.replay_widths --model smollm2 --methods jacobi --drafting-cost 0.27 --json out/replay.json

A step's modelled seconds are `base * (1 + row_cost * rows + drafting_cost * drafting + draft_row_cost * (rows - 1))`
(the step's rows in all its forwards; `drafting_cost` by the method's shape as the planner's prior: a base more with a
draft forward of its own, a quarter of one without, unless given), noiseless for the rates reported; the fitted
planner is shown each step's seconds times a lognormal factor of `--noise` (seeded). Reported per method: tokens per
modelled second of the pinned width, of plain AR steps (one token a step of one row), and of each adaptive run, with
`over_pinned`, `over_best` (over the better of pinned and plain) and the share of plain steps. `--model smollm2` replays
the real model's methods (`scripts.bench`'s, on its chat prompts) instead of the tiny checkpoints'.
"""

import argparse
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scripts.bench import METHODS, PROMPTS, REAL_METHODS
from scripts.trained_models import copy

LOSSLESS = ("diffusion_self", "diffusion_self_quadratic", "jacobi", "wedlm_spec")


@dataclass(frozen=True)
class ScriptedCost:
    """Seconds of a step by its rows and whether it drafted, relative to `base` (see the module)."""

    base: float = 4e-3
    row_cost: float = 0.025
    drafting_cost: float = 1.0
    draft_row_cost: float = 0.0

    def seconds(self, rows: int, drafting: int) -> float:
        return self.base * (1.0 + self.row_cost * rows + self.drafting_cost * drafting
                            + self.draft_row_cost * max(rows - 1, 0))

    @property
    def coefficients(self) -> list[float]:
        """As a method config's `step_cost`: seconds per step, per row, per drafting step, per draft row."""
        return [self.base, self.base * self.row_cost, self.base * self.drafting_cost, self.base * self.draft_row_cost]


class Replay:
    """One method on its checkpoint in the reference runner: `run(planner, clock)` decodes the prompts one at a time
    (a planner's state carried across them, as in an engine's process) and adds up the modelled cost of its steps."""

    def __init__(self, model_dir: Path, spec: dict, max_tokens: int, prompts: list[str]) -> None:
        from parallel_decoding.common.reference_setup import reference_setup

        self.setup = reference_setup(model_dir, spec["method"], {k: v for k, v in spec.items() if k != "method"})
        self.limits = self.setup.limits(max_tokens, stop_at_eos=False)
        self.prompts = [self.setup.tokenizer.encode(prompt) for prompt in prompts]

    def run(self, cost: ScriptedCost, planner=None, clock=None) -> dict:
        from parallel_decoding.common.sampling import SamplingParams

        runner = self.setup.runner
        if planner is not None:
            planner.began = lambda keys: None  # no gaps outside the steps: the runner's own would be this machine's
        runner.planner, runner.clock = planner, clock
        tokens = steps = plain = 0
        seconds = 0.0
        for prompt in self.prompts:
            decoder = self.setup.decoder(prompt, SamplingParams(), self.limits)
            rows, first = 0, True
            for step in runner.steps(decoder):
                rows += step.forward.num_tokens
                if not step.outcome.committed:
                    continue
                if not first:  # the prefill's step left out, as the engines' planners leave it
                    seconds += cost.seconds(rows, int(rows > 1))
                    tokens += len(step.outcome.committed)
                    steps += 1
                    plain += rows == 1
                rows, first = 0, False
        return {"tokens": tokens, "steps": steps, "seconds": seconds, "tokens_per_second": tokens / seconds,
                "plain_share": plain / steps}


def replay(name: str, model_dir: Path, spec: dict, cost: ScriptedCost, noises: list[float], seeds: int,
           max_tokens: int, prompts: list[str]) -> dict:
    """Pinned, exact and fitted runs of one method (see the module)."""
    from parallel_decoding.common.methods import parse_config
    from parallel_decoding.common.width_planner import StepCost, planner_for

    config = parse_config(spec["method"], {k: v for k, v in spec.items() if k != "method"})
    prior = StepCost.PRIOR if config.shape().extra_forward else StepCost.PRIOR_ONE_FORWARD
    cost = replace(cost, drafting_cost=prior[2]) if cost.drafting_cost < 0 else cost
    pinned_spec = {**spec, "adaptive": False}
    run = Replay(model_dir, pinned_spec, max_tokens, prompts)
    pinned = run.run(cost)
    plain_rate = 1.0 / cost.seconds(1, 0)
    best = max(pinned["tokens_per_second"], plain_rate)
    adaptive_config = replace(config, adaptive=True)

    def scored(result: dict) -> dict:
        return {**result, "over_pinned": result["tokens_per_second"] / pinned["tokens_per_second"],
                "over_best": result["tokens_per_second"] / best}

    exact = scored(run.run(cost, planner_for(replace(adaptive_config, step_cost=cost.coefficients))))
    fitted = {}
    for noise in noises:
        results = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)

            def clock(rows: int, drafting: int, rng=rng, noise=noise) -> float:
                return cost.seconds(rows, drafting) * float(np.exp(noise * rng.standard_normal()))

            results.append(scored(run.run(cost, planner_for(adaptive_config), clock)))
        fitted[str(noise)] = {"runs": results,
                              "over_pinned": statistics.median(r["over_pinned"] for r in results),
                              "over_best": statistics.median(r["over_best"] for r in results),
                              "plain_share": statistics.median(r["plain_share"] for r in results)}
    return {"method": name, "cost": cost.coefficients, "pinned": pinned, "plain_tokens_per_second": plain_rate,
            "exact": exact, "fitted": fitted}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.replay_widths", description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--models", default="out/trained-models", help="the trained checkpoints (copied if missing)")
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--methods", help="default: the model's lossless methods")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8, help="requests a run, one at a time (the bench's prompts)")
    parser.add_argument("--row-cost", type=float, default=0.025, help="a row's cost over the base (prior: 0.025)")
    parser.add_argument("--drafting-cost", type=float, default=-1.0,
                        help="a drafting step's over the base (default: the planner's prior for the method's shape)")
    parser.add_argument("--draft-row-cost", type=float, default=0.0, help="a draft row's beyond a decode row's")
    parser.add_argument("--noise", default="0.3", help="relative spreads of the fitted planner's step times")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if args.model == "smollm2":
        from scripts import chat_prompts, smollm2

        paths, methods = {"smollm2": smollm2.ensure()}, REAL_METHODS
        pool = chat_prompts.texts(paths["smollm2"])
    else:
        paths, methods, pool = copy(Path(args.models)), METHODS, PROMPTS
    table = {name: (checkpoint, spec) for name, checkpoint, spec in methods}
    cost = ScriptedCost(row_cost=args.row_cost, drafting_cost=args.drafting_cost, draft_row_cost=args.draft_row_cost)
    noises = [float(n) for n in args.noise.split(",")]
    prompts = [pool[i % len(pool)] for i in range(args.prompts)]
    records = []
    chosen = args.methods.split(",") if args.methods else [name for name in LOSSLESS if name in table]
    if missing := sorted(set(chosen) - set(table)):
        parser.error(f"no such method for --model {args.model}: {', '.join(missing)}")
    for name in tqdm(chosen, desc="methods"):
        checkpoint, spec = table[name]
        records.append(replay(name, paths[checkpoint], spec, cost, noises, args.seeds, args.max_tokens, prompts))
        record = records[-1]
        fits = "; ".join(f"noise {noise}: {fit['over_pinned']:.3f}x pinned, {fit['over_best']:.3f}x best "
                         f"({fit['plain_share']:.0%} plain)" for noise, fit in record["fitted"].items())
        print(f"{name}: pinned {record['pinned']['tokens_per_second'] / record['plain_tokens_per_second']:.3f}x "
              f"plain; exact {record['exact']['over_pinned']:.3f}x pinned ({record['exact']['plain_share']:.0%} "
              f"plain); {fits}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
