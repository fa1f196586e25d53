"""Jacobi decoding and Jacobi Forcing's multi-block decoding with rejection recycling (seed 002, Alg. 1).

One causal window per step: the uncached committed tokens (the seed), the real-active (RA) block's drafts,
then K-1 pseudo-active blocks of n positions each. Only RA drafts are verified for commit (exact match plus
bonus when greedy, the lossless point-mass rejection rule when sampling); pseudo blocks freeze the prefix
that matches their own predictions and are promoted to RA, then re-verified, when RA completes.

Rejection recycling keeps an n-gram pool of what the trajectory has shown, as upstream builds it: each step
that rejects a draft adds (1) the recent output, this step's commit and the window's predictions after it
(every block's accepted prefix and current drafts), and (2) the predictions past the mismatch alone. A
continuation the text already took (a repeated line, a cycle) is in (1); predictions that were right but came
after a wrong one are in (2). Candidates are the continuations of the seed from its first occurrence in each
pool sequence, padded with the RA drafts; they are verified as extra branches that see only the prefix and
the seed, and the branch with the most accepted tokens wins. Branch choice uses greedy matches, a
deterministic function of the forward, so sampling stays exact.
"""

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from parallel_decoding.common.acceptance import accept_greedy_batch, verify
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.errors import require
from parallel_decoding.common.row_stats import RowReading, RowStats
from parallel_decoding.common.sampling import SamplingParams, choose
from parallel_decoding.common.width_planner import Shape, check_step_cost
from parallel_decoding.common.window import Attention, Forward, Outcome


@dataclass(frozen=True)
class JacobiConfig:
    """n drafts per block; K blocks (1 = plain Jacobi with a running window); spawn ratio r; n-gram pool and how its
    candidates are verified: `branches` beside the main drafts in one forward (the paper's), or `linear`, the newest
    candidate in place of the RA drafts (for verifiers that take one linear draft, as vLLM's). In the engines (and in
    the reference runner where set to true: `common.runner_widths`) `adaptive` (default on) verifies only as many of the
    window's drafts (and of each recycled branch's) each step as pay for their rows (`common.width_planner`; false: all
    of them), with `step_cost` a fixed cost model instead of the measured one."""

    block_size: int = 16
    num_blocks: int = 1
    spawn_ratio: float = 0.85
    pool_size: int = 0
    verification_size: int = 4
    recycling: str = "branches"
    adaptive: bool | None = None
    step_cost: list[float] | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.block_size, int) and self.block_size >= 1, "block_size", "a positive integer",
                self.block_size)
        require(isinstance(self.num_blocks, int) and self.num_blocks >= 1, "num_blocks", "a positive integer",
                self.num_blocks)
        require(0 < self.spawn_ratio <= 1, "spawn_ratio", "in (0, 1]", self.spawn_ratio)
        require(isinstance(self.pool_size, int) and self.pool_size >= 0, "pool_size", "an integer >= 0",
                self.pool_size)
        require(isinstance(self.verification_size, int) and self.verification_size >= 0, "verification_size",
                "an integer >= 0", self.verification_size)
        require(self.recycling in ("branches", "linear"), "recycling", "'branches' or 'linear'", self.recycling)
        require(self.adaptive in (None, True, False), "adaptive", "true or false", self.adaptive)
        check_step_cost(self.step_cost)

    @property
    def adapts(self) -> bool:
        """Whether the engines choose the widths by load (default: yes)."""
        return self.adaptive is not False

    @property
    def planned_width(self) -> int:
        """The most drafts a width planner gives a request a step: the window's."""
        return self.block_size * self.num_blocks

    def shape(self, uniform: bool = False) -> Shape:
        """How a step spends rows on drafts, for a width planner (`common.width_planner.planner_for`): recycled
        branches beside the main drafts only where the pool's candidates are verified as `branches`, priced at half of
        `verification_size` until the planner has measured how many a forward carries (`WidthPlanner.branched`: the
        pool has candidates only where drafts were rejected; on the tiny checkpoint 1.8 of 4 on average, and a shape
        priced at 4 held SGLang's `jacobi_recycling` at plain steps at batch 1); none where they replace the drafts
        (`linear`) or there is no pool."""
        branches = self.verification_size / 2 if self.pool_size and self.recycling == "branches" else 0.0
        return Shape(branches=branches, uniform=uniform)

    @property
    def history(self) -> int:
        """How many recent output tokens a pool sequence keeps before the step's commit."""
        return 4 * self.block_size

    @property
    def spawn_threshold(self) -> int:
        return math.ceil(self.spawn_ratio * self.block_size)


@dataclass
class PseudoBlock:
    """A pseudo-active block: n draft tokens from `start`, the first `accepted` frozen."""

    start: int
    tokens: list[int]
    accepted: int = 0


class JacobiDecoder(Decoder):
    # Drafting forwards in a row after which its drafts count as iterated (`Decoder.iterated`). Stale drafts (copies of
    # the first token, or after a plain step or a pause) converge over a few forwards: on the tiny Jacobi Forcing
    # checkpoint the stale drafts after SGLang resumed a paused request and those of the forward after accepted
    # nothing, and a planner that learnt from the latter held the request at no draft for the 45-60 steps before its
    # evidence faded, at batch 1 where drafting every step ran 1.31x AR (docs/adaptive-widths.md).
    SETTLED_AFTER = 2

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: JacobiConfig):
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.ra_drafts: list[int] = []
        self.fixed_ra_end = 0
        self.blocks: list[PseudoBlock] = []
        self.pool: deque[list[int]] = deque(maxlen=config.pool_size)
        self._branches: list[list[int]] = []
        self._main: list[int] = []  # the planned forward's main drafts (`main_drafts` when it was planned)
        self.draft_cap: int | None = None  # an engine's width planner's, set before each forward it plans
        self.verified = (0, 0)  # the last step's drafts verified and accepted, for an engine's planner
        self.drafted_in_a_row = 0  # drafting forwards since its drafts were last stale (its first: copies)

    @property
    def iterated(self) -> bool:
        """`Decoder.iterated`: its drafts have been iterated by `SETTLED_AFTER` drafting forwards in a row."""
        return self.drafted_in_a_row >= self.SETTLED_AFTER

    @property
    def next_position(self) -> int:
        return self.num_tokens

    @property
    def last_position(self) -> int:
        """The last logical position a committed token can take."""
        return len(self.prompt) + self.limits.max_tokens - 1

    @property
    def ra_end(self) -> int:
        """Exclusive end of the real-active block: running for plain Jacobi, fixed for multi-block."""
        if self.config.num_blocks == 1:
            return self.next_position + self.config.block_size
        return self.fixed_ra_end

    @property
    def window_end(self) -> int:
        end = self.blocks[-1].start + self.config.block_size if self.blocks else self.ra_end
        return min(end, self.last_position + 1)

    @property
    def most_drafts(self) -> int:
        """The drafts a forward verifies at most: the whole window."""
        return self.config.block_size * self.config.num_blocks

    def cap(self, width: int) -> None:
        """An engine's width planner's cap on the drafts of the next forward it plans (`plan`), the main ones and
        each recycled branch's (`common.width_planner.cap_widths`); 0 forwards the seed alone, a plain AR step."""
        self.draft_cap = width

    def main_drafts(self) -> list[int]:
        """Draft tokens for positions next_position .. window_end-1, RA first then pseudo blocks; with `linear`
        recycling, the newest pool candidate (cut to the RA block) instead when there is one."""
        if self.config.recycling == "linear" and (found := self.candidates()):
            return found[0][: self.ra_end - self.next_position]
        drafts = self.ra_drafts[: self.ra_end - self.next_position]
        for block in self.blocks:
            drafts = drafts + block.tokens
        return drafts[: self.window_end - self.next_position]

    def candidates(self) -> list[list[int]]:
        """Pool continuations of the seed (from its first occurrence in each pool sequence, padded with the RA
        drafts to the block), newest first, distinct and unlike the RA drafts, at most `verification_size`."""
        seed, room = self.last_token, min(self.config.block_size, self.last_position + 1 - self.next_position)
        ra = self._pad(self.ra_drafts, room)
        found: list[list[int]] = []
        for seq in reversed(self.pool):
            if seed not in seq[:-1]:
                continue
            start = seq.index(seed) + 1
            cand = seq[start : start + room]
            cand += ra[len(cand) :]
            if cand not in found and cand != ra:
                found.append(cand)
                if len(found) == self.config.verification_size:
                    break
        return found

    def recycle(self, committed: list[int], predicted: list[int], verified: int) -> None:
        """Pool what a step that rejected a draft has shown (see the module docstring): `predicted` are the
        window's per-position predictions, the first `verified` of them the winning branch's rows."""
        tail = predicted[len(committed) :]
        self.pool.append(self.output[-self.config.history :] + committed + tail)
        self.pool.append(tail[: verified - len(committed)])

    def after_prefill(self, logits: torch.Tensor) -> Outcome:
        outcome = super().after_prefill(logits)
        self.begin(outcome.committed[0])
        return outcome

    def begin(self, first: int) -> None:
        """Open the first block after the prompt's first token: n copies of it as drafts."""
        self.fixed_ra_end = len(self.prompt) + 1 + self.config.block_size
        self.ra_drafts = [first] * self.config.block_size
        self.drafted_in_a_row = 0

    def resumed(self, token: int) -> None:
        """The block opens after `token` (as after the prefill's first token)."""
        self.begin(token)
        self.commit([token])

    def catch_up(self, tokens: list[int]) -> None:
        """As its own plain steps would (`_plain_step`): the blocks move on by one position for each token."""
        for token in tokens:
            self.acceptance.record(0, 0)
            self.advance([token], 1)
            super().catch_up([token])
        self.drafted_in_a_row = 0

    def follow(self, predicted: list[int], committed: list[int]) -> None:
        """Engine-driven step: the engine verified `main_drafts()` (or the first of them it scheduled) itself and
        committed `committed`.

        `predicted` holds the verify forward's per-position predictions (see `advance`), one per verified draft and
        the bonus row.
        """
        drafts = len(predicted) - 1
        self.acceptance.record(drafts, len(committed) - 1)
        self.drafted_in_a_row = self.drafted_in_a_row + 1 if drafts > 0 else 0
        if self.config.pool_size and len(committed) <= drafts:
            self.recycle(committed, predicted, drafts + 1)
        self.advance(predicted, len(committed))
        self.commit(committed)

    @property
    def branches_planned(self) -> int:
        """The recycled branches its last planned forward carries beside the main drafts."""
        return len(self._branches)

    def plan(self) -> Forward:
        pending = self.tokens[self.cache_len :]
        cap = self.most_drafts if self.draft_cap is None else max(self.draft_cap, 0)
        self._main = self.main_drafts()[:cap]
        main = pending + self._main
        branches = self.candidates() if self.config.recycling == "branches" and cap else []
        self._branches = [cand[:cap] for cand in branches]
        ids = main + [t for cand in self._branches for t in cand]
        positions = list(range(self.cache_len, self.cache_len + len(main)))
        n = len(ids)
        visible = torch.ones(n, n, dtype=torch.bool).tril() if self._branches else None
        start = len(main)
        for cand in self._branches:
            positions += range(self.next_position, self.next_position + len(cand))
            visible[start : start + len(cand), len(pending) : start] = False
            start += len(cand)
        return Forward(
            token_ids=torch.tensor(ids),
            positions=torch.tensor(positions),
            logit_rows=torch.arange(len(pending) - 1, n),
            attention=Attention.CAUSAL if visible is None else Attention.CUSTOM,
            mask=visible,
        )

    def reads(self, forward: Forward) -> RowReading:
        return RowReading()

    def update(self, rows: RowStats) -> Outcome:
        return self.update_batch([self], rows, [len(rows)])[0]

    @classmethod
    def update_batch(cls, decoders: Sequence["JacobiDecoder"], rows: RowStats, sizes: Sequence[int]) -> list[Outcome]:
        """Each decoder verifies its main drafts' RA block and its recycled branches (`plan`): every option of every
        decoder is matched greedily in one pass over the batch, and the one accepting most wins (the main drafts on
        a tie); sampling decoders then accept its drafts by the point-mass rule. Each decoder's blocks then take its
        window's predictions (`advance`)."""
        starts = list(accumulate(sizes, initial=0))
        outcomes: list[Outcome | None] = [None] * len(decoders)
        plain = [i for i, decoder in enumerate(decoders)
                 if decoder.sampling.greedy and not decoder._main and not decoder._branches]
        if plain:  # no draft to verify (a plain AR step): the row's argmax, read for all of them at once
            rows_at = torch.tensor([starts[i] for i in plain])
            for i, token, margin in zip(plain, rows.token[rows_at].tolist(), rows.margin[rows_at].tolist(),
                                        strict=True):
                outcomes[i] = decoders[i]._plain_step(token, margin)
        deciding = [i for i in range(len(decoders)) if outcomes[i] is None]
        if not deciding:
            return outcomes
        owners, drafts, option_rows = [], [], []  # per option: decoder, drafts, rows
        firsts, mains = [], []  # per decoder: its first option, its main window's rows
        for i in deciding:
            decoder = decoders[i]
            main = decoder._main
            mains.append(len(main) + 1)
            firsts.append(len(drafts))
            owners.append(i)
            drafts.append(main[: decoder.ra_end - decoder.next_position])
            option_rows.append(list(range(len(drafts[-1]) + 1)))
            offset = len(main) + 1
            for cand in decoder._branches:
                owners.append(i)
                drafts.append(cand)
                option_rows.append([0, *range(offset, offset + len(cand))])
                offset += len(cand)
        width = max(len(r) for r in option_rows)
        index = torch.tensor([[starts[i] + r for r in (rs + rs[:1] * (width - len(rs)))]
                              for i, rs in zip(owners, option_rows, strict=True)])
        greedy = accept_greedy_batch(drafts, rows.token[index])
        for i, first, n_main in zip(deciding, firsts, mains, strict=True):
            decoder = decoders[i]
            best = max(range(first, first + len(decoder._branches) + 1), key=lambda k: (len(greedy[k]), -k))
            outcomes[i] = decoder._verified(rows.part(starts[i], starts[i + 1]), drafts[best], option_rows[best],
                                            greedy[best], n_main, best == first)
        return outcomes

    def _plain_step(self, token: int, margin: float) -> Outcome:
        """`_verified` of a greedy step that verified no draft: its one row's argmax `token` (of slack `margin`)
        is committed and the blocks move on by one position."""
        self.note_margin(margin)
        self.acceptance.record(0, 0)
        self.verified = (0, 0)
        self.drafted_in_a_row = 0
        n_pending = self.num_tokens - self.cache_len
        self.advance([token], 1)
        return Outcome([token], kv_keep=n_pending)

    def _verified(self, rows: RowStats, drafts: list[int], option_rows: list[int], greedy: list[int], n_main: int,
                  main: bool) -> Outcome:
        """Commit from the winning option, `drafts` verified by `option_rows` of this decoder's `rows` (`greedy`
        what greedy acceptance commits), of the `n_main` rows of its main window or (not `main`) a branch."""
        n_pending = self.num_tokens - self.cache_len
        if self.sampling.greedy:
            self.note_margin(float(rows.margin.min()) if len(rows) else float("inf"))
            committed = greedy
        else:
            committed = verify(torch.tensor(drafts, dtype=torch.long), rows.logits[option_rows], self.sampling,
                               self.generator)
        self.acceptance.record(len(drafts), len(committed) - 1)
        # A planner learns what iterated drafts accept; stale ones (after a plain step) only refresh them.
        self.verified = (len(drafts), len(committed) - 1) if self.iterated else (0, 0)
        self.drafted_in_a_row = self.drafted_in_a_row + 1 if drafts else 0
        # The next drafts come from the winning option's rows where it has them, the main window's after.
        window = torch.tensor(option_rows + list(range(len(option_rows), n_main)))
        predicted = (rows.token[window] if self.sampling.greedy
                     else choose(rows.logits[window], self.sampling, self.generator)).tolist()
        if self.config.pool_size and len(committed) <= len(drafts):
            self.recycle(committed, predicted, len(option_rows))
        self.advance(predicted, len(committed))
        return Outcome(committed, kv_keep=n_pending + (len(committed) - 1 if main else 0))

    def advance(self, predicted: list[int], num_committed: int) -> None:
        """Jacobi update of every block from one forward's per-position predictions, then promote and spawn.

        `predicted[i]` is the token predicted for position `next_position + i` (before this step's commit) and
        `num_committed` how many tokens were committed; an engine that verifies with its own rejection sampler
        calls this directly instead of `update`.
        """
        old_next = self.next_position
        new_next = old_next + num_committed
        n = self.config.block_size

        def pred(position: int) -> int | None:
            index = position - old_next
            return predicted[index] if 0 <= index < len(predicted) else None

        for block in self.blocks:
            while block.accepted < n and block.tokens[block.accepted] == pred(block.start + block.accepted):
                block.accepted += 1
            for i in range(block.accepted, n):
                if (p := pred(block.start + i)) is not None:
                    block.tokens[i] = p
        held = self.ra_drafts  # for positions old_next ..

        def known(position: int) -> int | None:
            """The forward's prediction there, else the RA draft held there (past a window cut short by an engine's
            width planner)."""
            index = position - old_next
            return pred(position) if index < len(predicted) or index >= len(held) else held[index]

        end = old_next + max(len(predicted), len(held))
        tail = [t for pos in range(new_next, end) if (t := known(pos)) is not None]
        if self.config.num_blocks == 1:
            self.ra_drafts = self._pad(tail, n)
            return
        self.ra_drafts = self._pad(tail, self.fixed_ra_end - new_next)
        while new_next >= self.fixed_ra_end:
            if self.blocks:
                block = self.blocks.pop(0)
                self.fixed_ra_end = block.start + n
                self.ra_drafts = block.tokens[new_next - block.start :]
            else:
                self.fixed_ra_end = new_next + n
                self.ra_drafts = self._pad(tail, n)
        newest = self.blocks[-1].accepted if self.blocks else n - (self.fixed_ra_end - new_next)
        start = self.blocks[-1].start + n if self.blocks else self.fixed_ra_end
        if (
            len(self.blocks) + 1 < self.config.num_blocks
            and newest >= self.config.spawn_threshold
            and start <= self.last_position
        ):
            self.blocks.append(PseudoBlock(start, self._pad(self.ra_drafts, n)))

    def _pad(self, tokens: list[int], length: int) -> list[int]:
        """`tokens` cut or padded to `length` by repeating the last one (the seed when empty)."""
        fill = tokens[-1] if tokens else self.last_token
        return (tokens + [fill] * length)[: max(length, 0)]
