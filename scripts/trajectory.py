"""Trajectory pictures (seed 000 Fig. 4, seed 002 Fig. 4 style): every forward of one request as a row, the tokens
it held at each generated position, coloured by what became of them.

Green: committed by this forward (an accepted draft, a bonus token, a committed fill). Blue: a draft or fill already
equal to the final token, not committed yet (frozen). Red: a draft or fill that differs from the final token
(rejected or later replaced). Grey: a mask. Spaces show as middle dots.
Reference runner, any method and preset.

    python -m scripts.trajectory --model DIR --method jacobi [--config JSON] [--prompt TEXT] [--max-tokens 32] \\
        --png OUT.png
"""

import argparse
import sys
from dataclasses import dataclass

import torch

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.methods import step_methods
from parallel_decoding.common.reference_setup import reference_setup
from parallel_decoding.common.sampling import SamplingParams

COLOURS = {"committed": "#4caf50", "frozen": "#64b5f6", "rejected": "#e57373", "mask": "#e0e0e0"}


@dataclass
class Cell:
    step: int
    slot: int  # generated position (0 = first token after the prompt)
    token: int
    kind: str  # a COLOURS key


def trace(model_dir: str, method: str, settings: str | None, prompt: str, max_tokens: int
          ) -> tuple[list[Cell], list[int], object]:
    """Every cell of the request's trajectory, its final output and the tokenizer."""
    setup = reference_setup(model_dir, method, settings)
    tokenizer = setup.tokenizer
    ids = tokenizer.encode(prompt)
    decoder = setup.decoder(ids, SamplingParams(), setup.limits(max_tokens))
    mask = getattr(setup.config, "mask_token_id", None)
    held: list[tuple[int, list[tuple[int, int]], list[int], int]] = []
    for step, record in enumerate(setup.runner.steps(decoder)):
        done = len(decoder.output) - len(record.outcome.committed)
        slots = [(int(p) - len(ids), int(t)) for p, t in zip(record.forward.positions, record.forward.token_ids,
                                                             strict=True) if int(p) - len(ids) >= done]
        held.append((step, slots, record.outcome.committed, done))
    final = decoder.output
    cells = []
    for step, slots, committed, done in held:
        now = dict(enumerate(committed, start=done))
        for slot, token in slots:
            if slot in now:
                continue
            kind = "mask" if token == mask else "frozen" if slot < len(final) and token == final[slot] else "rejected"
            cells.append(Cell(step, slot, token, kind))
        cells += [Cell(step, slot, token, "committed") for slot, token in now.items()]
    return cells, final, tokenizer


def draw(cells: list[Cell], tokenizer, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    steps, slots = max(c.step for c in cells) + 1, max(c.slot for c in cells) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * slots), max(3.0, 0.3 * steps + 1)))
    for c in cells:
        ax.add_patch(Rectangle((c.slot, c.step), 1, 1, facecolor=COLOURS[c.kind], edgecolor="white"))
        text = "[M]" if c.kind == "mask" else tokenizer.decode([c.token]).replace("\n", "\\n").replace(" ", "·")[:5]
        ax.text(c.slot + 0.5, c.step + 0.5, text, ha="center", va="center", fontsize=5, family="monospace")
    ax.set_xlim(0, slots)
    ax.set_ylim(steps, 0)
    ax.set_xlabel("generated position")
    ax.set_ylabel("forward")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Patch(color=v, label=k) for k, v in COLOURS.items()], loc="lower left", fontsize=7,
              bbox_to_anchor=(0, 1.04), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.trajectory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", required=True, choices=sorted(step_methods()))
    parser.add_argument("--config", default=None, help="method settings: a JSON object or a .json file")
    parser.add_argument("--prompt", default="def wrap(text, width=70):")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--png", required=True)
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    try:
        cells, final, tokenizer = trace(args.model, args.method, args.config, args.prompt, args.max_tokens)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    forwards = max(c.step for c in cells) + 1
    title = (f"{args.method} {args.config or ''} on {args.model}: {len(final)} tokens in {forwards} forwards\n"
             f"{args.prompt!r} -> {tokenizer.decode(final)[:80]!r}")
    draw(cells, tokenizer, title, args.png)
    print(f"{len(final)} tokens, {forwards} forwards: {args.png}")


if __name__ == "__main__":
    main()
