"""Where a committing method's forwards hold AR's distribution of each token it commits: the rows an engine reads
the reported `logprobs` from, with no extra forward.

WeDLM's window, block diffusion's commit forward and quadratic self-speculation's chain each forward the tokens
they commit causally, first among the rows at their positions: the row at the position before a committed token
sees exactly the tokens before it, so its logits are AR's for it. Two exceptions: the first token of a WeDLM commit,
whose row (its last committed token's, or the prompt's last) ran in the forward that committed that token, so an
engine carries that row from step to step (`next_row`); and the tokens block diffusion settles at a request's end
in a bidirectional reveal forward, which no row of it predicts causally (engines forward them causally to emit
them, and read that forward's rows).
"""

from dataclasses import dataclass

from common.window import Forward


@dataclass(frozen=True)
class LogprobRows:
    """For the tokens a forward committed: `rows[j]` the forward row whose logits are AR's for token j (None: not in
    this forward: for the first token, the row carried from an earlier forward), and `next_row` the row that is
    AR's for the token after them (None: not in this forward)."""

    rows: list[int | None]
    next_row: int | None


def logprob_rows(forward: Forward, first: int, count: int) -> LogprobRows:
    """The rows of `forward` that predict `count` tokens committed at logical positions `first` onwards: for each,
    the first row at the position before it, where that row sees no forwarded row past its own position."""
    positions = forward.positions
    causal = ~(forward.visibility() & (positions[None, :] > positions[:, None])).any(-1)
    first_row: dict[int, int] = {}
    for row, position in enumerate(positions.tolist()):
        if causal[row]:
            first_row.setdefault(position, row)
    rows = [first_row.get(position) for position in range(first - 1, first + count)]
    return LogprobRows(rows[:-1], rows[-1])
