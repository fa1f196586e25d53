"""The width planner in the reference runner: recycling Jacobi at batch 1 on the trained Jacobi Forcing checkpoint,
each step capped by a `common.width_planner` under a fixed cost model (seconds per row and per drafting step as
shares of a plain step), against the fixed width; tokens per forward and the speedup over AR the cost model predicts
(no clock: the same cost model prices AR's steps), per cost model."""

from pathlib import Path

from tqdm import tqdm

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.width_planner import Shape, StepCost, WidthPlanner, cap_widths
from scripts.bench import PROMPTS, preset
from scripts.trained_models import copy

# (share of a plain step per row, per drafting step): rows nearly free, the prior's slope, the prior's with SGLang's
# windows path at batch 1 (measured: docs/adaptive-widths.md), rows dear.
COSTS = [(0.01, 0.0), (0.025, 0.0), (0.025, 0.5), (0.1, 0.0)]


def decode(runner: ReferenceRunner, decoder: Decoder, cost: StepCost, planner: WidthPlanner | None) -> float:
    """Run `decoder` to its end, capped by `planner` each step (none: the configured width); its predicted
    seconds (the prefill left out)."""
    seconds = 0.0
    for step in runner.steps(decoder):
        if planner is not None and not decoder.finished:
            cap_widths(planner, ["request"], [decoder])
        rows = step.forward.token_ids.numel()
        if decoder.forwards > 1:
            seconds += float(cost.predict(*map(float, (rows, rows > 1))))
    return seconds


def run(models: str = "out/trained-models", max_tokens: int = 64) -> list[dict]:
    """Per cost model: the planner's and the fixed width's tokens per forward and predicted speedup over AR."""
    path = copy(Path(models))["jacobi_forcing"]
    model, tokenizer = load(path)
    runner = ReferenceRunner(model)
    config = parse_config("jacobi", preset("tiny-jacobi-forcing.json"))
    shape = Shape(branches=config.verification_size if config.recycling == "branches" else 0)
    rows = []
    for per_row, per_drafting in tqdm(COSTS, desc="cost models"):
        cost = StepCost((1.0, per_row, per_drafting))
        for adaptive in (True, False):
            tokens = forwards = 0
            seconds = 0.0
            for prompt in PROMPTS:
                decoder = make_decoder("jacobi", config, tokenizer(prompt)["input_ids"], SamplingParams(),
                                       Limits(max_tokens=max_tokens))
                planner = WidthPlanner(decoder.most_drafts, shape, cost) if adaptive else None
                seconds += decode(runner, decoder, cost, planner)
                tokens, forwards = tokens + len(decoder.output) - 1, forwards + decoder.forwards - 1
            ar_seconds = tokens * float(cost.predict(*map(float, (1, 0))))
            rows.append({"per_row": per_row, "per_drafting_step": per_drafting, "adaptive": adaptive,
                         "tokens_per_forward": round(tokens / forwards, 3), "speedup": round(ar_seconds / seconds, 3)})
    print(f"{'per row':>8} {'drafting':>8} {'width':>8} {'tok/fwd':>8} {'speedup':>8}")
    for row in rows:
        print(f"{row['per_row']:>8} {row['per_drafting_step']:>8} {'planned' if row['adaptive'] else 'fixed':>8} "
              f"{row['tokens_per_forward']:>8.2f} {row['speedup']:>8.2f}")
    return rows
