"""Where a committing method's forwards hold AR's distribution of each token it commits: the rows an engine reads
the reported `logprobs` from, with no extra forward.

A row at the position before a committed token that sees exactly the tokens before it (the cached prefix, then
forwarded rows at every position up to its own, each holding the committed token there) has AR's logits for it.
WeDLM's leading filled run, block diffusion's commit forward, quadratic self-speculation's chain and the accepted
branch of Jacobi's rejection recycling forward such rows. Two exceptions: the first token of a WeDLM commit, whose
row (its last committed token's, or the prompt's last) ran in the forward that committed that token, so an engine
carries that row from step to step (`next_row`); and the tokens block diffusion settles at a request's end in a
bidirectional reveal forward, which no row of it predicts (engines forward them causally to emit them, and read
that forward's rows).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from parallel_decoding.common.window import Forward


@dataclass(frozen=True)
class LogprobRows:
    """For the tokens a forward committed: `rows[j]` the forward row whose logits are AR's for token j (None: not in
    this forward: for the first token, the row carried from an earlier forward), and `next_row` the row that is
    AR's for the token after them (None: not in this forward)."""

    rows: list[int | None]
    next_row: int | None


def logprob_rows(forward: Forward, tokens: Sequence[int], first: int, count: int) -> LogprobRows:
    """The rows of `forward` (over a cached prefix that ends where its rows begin) whose logits are AR's for the
    `count` tokens committed at positions `first` onwards and for the one after them; `tokens`: the request's
    tokens, those included."""
    positions, ids = forward.positions.tolist(), forward.token_ids.tolist()
    start, visible = min(positions, default=0), forward.visibility()
    found: dict[int, int] = {}
    for row, position in enumerate(positions):
        if position in found or not first - 1 <= position < first + count:
            continue
        seen = visible[row].nonzero().flatten().tolist()
        if (sorted(positions[i] for i in seen) == list(range(start, position + 1))
                and all(ids[i] == tokens[positions[i]] for i in seen)):
            found[position] = row
    rows = [found.get(position) for position in range(first - 1, first + count)]
    return LogprobRows(rows[:-1], rows[-1])
