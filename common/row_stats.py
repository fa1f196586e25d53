"""Logit rows reduced to what a decoder's decision reads (argmax, its slack, entropy, confidence), computed for a
whole batch of requests in one pass: engines hand greedy decoders these few numbers per row instead of
full-vocabulary rows copied to the host per request (`apply_rows`). A decoder given plain logits reduces them
with the same kernel, so the per-request reference and the engines' batched path decide alike."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from parallel_decoding.common.margins import top2_rows

if TYPE_CHECKING:
    from parallel_decoding.common.decoder import Decoder
    from parallel_decoding.common.window import Outcome


@dataclass(frozen=True)
class RowReading:
    """How a decoder's next update reads its rows: as `RowStats`, `excluded` (the mask token) never chosen in the
    rows from `from_row` on (a forward's mask slots, after rows that verify); `scores`: whether it reads the rows'
    entropy and confidence (a softmax over the vocabulary, which a decision on the argmax alone does not pay)."""

    excluded: int | None = None
    from_row: int = 0
    scores: bool = False


# Logit elements one CPU pass reduces: its float32 temporaries (1 MiB each) stay in cache, where a whole batch's
# (hundreds of rows) would not, and run 3x slower. `scripts.profile_step --part digest` on a 2-core EPYC, batch 32,
# 512 vocabulary: 1 << 18 takes 10-12 ms where 1 << 20 took 15-17 (quadratic self-speculation, 2203 rows), 4 ms where
# it took 6.5-7 (jacobi, 876 rows); one row of a 151936 vocabulary per pass runs as fast as six.
CPU_PASS_ELEMENTS = 1 << 18


@dataclass
class RowStats:
    """Per row: `token` the argmax, `margin` its slack (`common.margins.top2_rows`; inf where not asked for),
    `entropy` and `confidence` (the argmax's probability) of the softmax (NaN where not asked for); `logits` (after
    the exclusion) kept where the decoder samples."""

    token: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor
    confidence: torch.Tensor
    logits: torch.Tensor | None = None

    @classmethod
    def of(cls, logits: torch.Tensor, excluded: int | None = None, keep_logits: bool = False,
           excluding: torch.Tensor | None = None, scores: bool = True, margins: bool = True) -> "RowStats":
        """The stats of `logits`' rows, `excluded` never chosen in the rows `excluding` marks (default: all); the
        entropy and confidence only where `scores`, the margins only where `margins` (an engine's decoders decide
        without them: only the reference runner's tie-aware tests read margins); on CPU a few rows at a time
        (`CPU_PASS_ELEMENTS`), on a GPU all at once."""
        rows = len(logits) if logits.device.type != "cpu" else max(1, CPU_PASS_ELEMENTS // max(logits.shape[-1], 1))
        if len(logits) <= rows:
            return cls._of(logits, excluded, keep_logits, excluding, scores, margins)
        parts = [cls._of(logits[i : i + rows], excluded, keep_logits,
                         None if excluding is None else excluding[i : i + rows], scores, margins)
                 for i in range(0, len(logits), rows)]
        return cls(*(torch.cat([getattr(part, name) for part in parts]) for name in ("token", "margin", "entropy",
                                                                                       "confidence")),
                   torch.cat([part.logits for part in parts]) if keep_logits else None)

    @classmethod
    def _of(cls, logits: torch.Tensor, excluded: int | None, keep_logits: bool, excluding: torch.Tensor | None,
            scores: bool, margins: bool) -> "RowStats":
        converted = logits.float()  # a copy of our own unless they were float32 already
        if excluded is not None and (excluding is None or bool(excluding.any())):
            converted = converted.clone() if converted is logits else converted
            converted[slice(None) if excluding is None else excluding.to(logits.device), excluded] = float("-inf")
        logits = converted
        token = logits.max(-1).indices  # the argmax, ties to the first as argmax's, 3x faster on CPU
        margin = top2_rows(logits, token) if margins else torch.full(token.shape, float("inf"), device=token.device)
        if not scores:
            unread = torch.full(token.shape, float("nan"), device=token.device)
            return cls(token, margin, unread, unread, logits if keep_logits else None)
        log_probs = logits.log_softmax(-1)
        probs = log_probs.exp()
        plogp = probs * (log_probs if excluded is None else log_probs.nan_to_num(neginf=0.0))  # 0 log 0 = 0
        return cls(token, margin, -plogp.sum(-1), probs.gather(-1, token[:, None])[:, 0],
                   logits if keep_logits else None)

    def __len__(self) -> int:
        return self.token.numel()

    def host(self) -> "RowStats":
        """On the host, in one copy (float32 values and token ids are exact in float64)."""
        values = torch.stack([self.token.double(), self.margin.double(), self.entropy.double(),
                              self.confidence.double()]).cpu()
        logits = None if self.logits is None else self.logits.cpu()
        return RowStats(values[0].long(), values[1].float(), values[2].float(), values[3].float(), logits)

    def part(self, start: int, stop: int) -> "RowStats":
        """Rows `start` to `stop` (views)."""
        rows = slice(start, stop)
        return RowStats(self.token[rows], self.margin[rows], self.entropy[rows], self.confidence[rows],
                        None if self.logits is None else self.logits[rows])


def padded(values: torch.Tensor, sizes: Sequence[int], fill: float | int) -> tuple[torch.Tensor, torch.Tensor]:
    """Consecutive runs of `sizes` values as the rows of a [len(sizes), max(sizes)] tensor, `fill` past each run,
    and the mask of the entries that hold one: how a batch's decisions run over all its requests at once."""
    lengths = torch.tensor(list(sizes))
    valid = torch.arange(max(sizes, default=0))[None, :] < lengths[:, None]
    out = values.new_full(valid.shape, fill)
    out[valid] = values
    return out, valid


def member_rows(starts: Sequence[int] | torch.Tensor, sizes: Sequence[int] | torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows `starts[i]` to `starts[i] + sizes[i]` of each member, concatenated, and each row's offset within its
    member's run: a batch's row index built in a few tensor ops rather than one per request."""
    lengths = torch.as_tensor(sizes, dtype=torch.long)
    if bool((lengths == 1).all()):  # a row each (a batch of plain steps): no repeats to lay out
        return torch.as_tensor(starts, dtype=torch.long), torch.zeros(len(lengths), dtype=torch.long)
    firsts = lengths.cumsum(0) - lengths
    offsets = torch.arange(int(lengths.sum())) - firsts.repeat_interleave(lengths)
    return torch.as_tensor(starts, dtype=torch.long).repeat_interleave(lengths) + offsets, offsets


def rows_of(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`logits[index]`, without copying where the index takes every row in order (a step of plain AR steps)."""
    if len(index) == len(logits) and torch.equal(index, torch.arange(len(logits))):
        return logits
    return logits.index_select(0, index.to(logits.device))


def apply_rows(decoders: Sequence["Decoder"], logits: torch.Tensor, sizes: Sequence[int], margins: bool = True
               ) -> list["Outcome"]:
    """Each decoder digests its `sizes[i]` consecutive rows of `logits` (any device). Greedy decoders that read
    `RowStats` get them from one pass per exclusion over all their rows and one copy to the host, and decide
    together per method (`Decoder.apply_batch`); the others (sampled, or with penalties, biases or a
    grammar) get their rows as float32 on the host. Not `margins`: the batched decisions note no argmax slack
    (an engine's decoders, whose margins nothing reads), and skip computing it."""
    starts = torch.tensor([0, *sizes]).cumsum(0).tolist()
    outcomes: list[Outcome | None] = [None] * len(decoders)
    batched: dict[tuple[int | None, bool, type], list[int]] = {}
    from_rows: list[int] = [0] * len(decoders)
    for i, decoder in enumerate(decoders):
        reading = decoder.reading
        if reading is not None and decoder.sampling.greedy and not decoder.reads_logits:
            batched.setdefault((reading.excluded, reading.scores, type(decoder)), []).append(i)
            from_rows[i] = reading.from_row
        else:
            outcomes[i] = decoder.apply(logits[starts[i] : starts[i + 1]].float().cpu())
    for (excluded, scores, method), members in batched.items():
        counts = [sizes[i] for i in members]
        index, offsets = member_rows([starts[i] for i in members], counts)
        from_row = torch.tensor([from_rows[i] for i in members])
        excluding = offsets >= (from_row if set(counts) == {1} else from_row.repeat_interleave(torch.tensor(counts)))
        stats = RowStats.of(rows_of(logits, index), excluded, excluding=excluding, scores=scores,
                            margins=margins).host()
        found = method.apply_batch([decoders[i] for i in members], stats, counts)
        for i, outcome in zip(members, found, strict=True):
            outcomes[i] = outcome
    return outcomes
