"""The per-request state machine every method implements: plan a forward, then digest its logits."""

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.acceptance import AcceptanceStats
from parallel_decoding.common.errors import require
from parallel_decoding.common.grammar import Grammar, accepts, masked
from parallel_decoding.common.penalties import adjusted
from parallel_decoding.common.row_stats import RowReading, RowStats
from parallel_decoding.common.sampling import SamplingParams, choose
from parallel_decoding.common.window import Forward, Outcome, causal_forward


@dataclass(frozen=True)
class Limits:
    """When a request stops: after `max_tokens` generated tokens or on any of `eos_token_ids` (kept). `context`
    (None: unbounded) is how many positions a forward may use, an engine's model length: windows that reach past
    `max_tokens` stop short of it."""

    max_tokens: int = 64
    eos_token_ids: tuple[int, ...] = ()
    context: int | None = None

    def __post_init__(self) -> None:
        require(self.max_tokens >= 1, "max_tokens", "a positive integer", self.max_tokens)


class Decoder(margins.DecisionMargins, ABC):
    """One request. The first forward is the prompt's causal prefill; each later one is the method's.

    Invariant: the KV of `tokens[:cache_len]` is valid in the cache; after `apply` the caller crops the
    cache to `cache_len` (the method says how many forwarded rows stay valid via `Outcome.kv_keep`).
    """

    # Whether the drafts it proposes next come from a forward that drafted: Jacobi's are stale after a plain step
    # or a pause, and what such drafts accept is not what drafting accepts (a width planner does not learn from it).
    iterated = True

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits) -> None:
        require(len(prompt) > 0, "prompt", "at least one token", prompt)
        self.prompt = list(prompt)
        self.output: list[int] = []
        self.sampling = sampling
        self.limits = limits
        self.generator = sampling.generator()
        self.cache_len = 0
        self.finished = False
        self.forwards = 0
        self.decode_rows = 0
        self.prefill_tokens = 0
        self.acceptance = AcceptanceStats()
        self.margins: list[float] = []
        self.grammar: Grammar | None = None  # structured output: set before the first forward (`common.grammar`)
        self._pending: Forward | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @classmethod
    def resume(cls, tokens: list[int], sampling: SamplingParams, limits: Limits, config: object,
               generator: torch.Generator | None = None) -> "Decoder":
        """A decoder taking over a request an engine serves: every token but the last is its prompt, the last one
        it has just committed (engines start one after the prefill, and again when it lost track of the request).
        `generator`: the request's own, when the engine draws from one stream for it."""
        decoder = cls(tokens[:-1], sampling, limits, config)
        if generator is not None:
            decoder.generator = generator
        decoder.resumed(tokens[-1])
        return decoder

    def resumed(self, token: int) -> None:
        """Take `token`, the last of the tokens `resume` was given, as just committed."""
        self.commit([token])

    def pause(self) -> None:
        """An engine takes this request's plain AR steps itself (greedy, its rows unadjusted) until `catch_up`, so a
        step held at no draft costs no digest: what the decoder holds for its next forward is void."""

    def catch_up(self, tokens: list[int]) -> None:
        """The tokens the engine committed since `pause`, one plain AR step each: all but the last one cached, as
        after this decoder's own plain steps."""
        self.forwards += len(tokens)
        self.decode_rows += len(tokens)
        self.commit(tokens)
        self.cache_len = self.num_tokens - 1

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def tokens_per_forward(self) -> float:
        return len(self.output) / max(self.forwards, 1)

    @property
    def p_cache(self) -> float:
        """WeDLM eq. 4: tokens generated after the prefill over token rows those forwards processed."""
        return (len(self.output) - self.prefill_tokens) / max(self.decode_rows, 1)

    def next_forward(self) -> Forward:
        """What the next forward must contain."""
        assert not self.finished, "request already finished"
        if self.grammar is not None and self.forwards:
            self.settle(self.grammar)
        self._pending = self.prefill() if self.forwards == 0 else self.plan()
        return self._pending

    def settle(self, grammar: Grammar) -> None:
        """Before a forward under a grammar: undo decided tokens past the committed ones that the grammar rejects
        (methods that decide tokens on rows the grammar could not mask, `common.grammar`, override it)."""

    @property
    def mask_token_id(self) -> int | None:
        return getattr(getattr(self, "config", None), "mask_token_id", None)

    @property
    def reads_logits(self) -> bool:
        """Whether its rows must reach `apply` as logits: penalties, biases or a grammar change them."""
        return self.sampling.adjusts_logits or self.grammar is not None

    @property
    def reading(self) -> RowReading | None:
        """How the update of the planned forward reads its rows: reduced to `RowStats` (which an engine may hand
        over for many requests at once, `common.row_stats.apply_rows`), or None: as full logits."""
        return None if self._pending is None or self.forwards == 0 else self.reads(self._pending)

    def reads(self, forward: Forward) -> RowReading | None:
        """`reading` for a planned forward after the prefill; methods whose update takes `RowStats` say so."""
        return None

    def apply(self, logits: torch.Tensor | RowStats) -> Outcome:
        """Digest the logits of the planned forward's `logit_rows` (in that order), or the `RowStats` of them
        where `reading` says the update reads those; logits get the request's penalties and biases first, then its
        grammar's masks."""
        assert not (self.reads_logits and isinstance(logits, RowStats)), "adjusted requests are digested from logits"
        if self.sampling.adjusts_logits:
            logits = adjusted(logits, self.sampling, self.prompt, self.output, self._pending, self.mask_token_id)
        if self.grammar is not None:
            logits = masked(logits, self.grammar, self._pending, self.num_tokens, self.mask_token_id)
        reading = self.reading
        if reading is not None and not isinstance(logits, RowStats):
            logits = RowStats.of(logits, reading.excluded, keep_logits=not self.sampling.greedy,
                                 excluding=torch.arange(len(logits)) >= reading.from_row, scores=reading.scores)
        first = self._digesting()
        return self._digested(self.after_prefill(logits) if first else self.update(logits), first)

    @classmethod
    def apply_batch(cls, decoders: Sequence["Decoder"], rows: RowStats, sizes: Sequence[int]) -> list[Outcome]:
        """`apply` for decoders of this method past their prefill whose updates read `RowStats`, given their
        `sizes[i]` consecutive rows of `rows`: their decisions taken together (`update_batch`)."""
        for decoder in decoders:
            decoder._digesting()
        return [decoder._digested(outcome, False)
                for decoder, outcome in zip(decoders, cls.update_batch(decoders, rows, sizes), strict=True)]

    @classmethod
    def update_batch(cls, decoders: Sequence["Decoder"], rows: RowStats, sizes: Sequence[int]) -> list[Outcome]:
        """`update` for several decoders, each reading its `sizes[i]` consecutive rows. Methods whose decisions run
        over the batch as tensors override it, and their `update` is the batch of one."""
        starts = list(accumulate(sizes, initial=0))
        return [decoder.update(rows.part(starts[i], starts[i + 1])) for i, decoder in enumerate(decoders)]

    def _digesting(self) -> bool:
        """Count the planned forward as digested; whether it is the prefill."""
        forward, self._pending = self._pending, None
        assert forward is not None, "apply() without next_forward()"
        first = self.forwards == 0
        if not first:
            self.decode_rows += forward.num_tokens
        self.forwards += 1
        return first

    def _digested(self, outcome: Outcome, first: bool) -> Outcome:
        """Commit the forward's outcome and keep its KV."""
        outcome.committed = self.commit(outcome.committed)
        self.cache_len = min(self.cache_len + outcome.kv_keep, self.num_tokens)  # rows past an end are not kept
        if first:
            self.prefill_tokens = len(outcome.committed)
        return outcome

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """`choose` with the request's sampling, noting the slack of a greedy choice."""
        if self.sampling.greedy:
            self.note_margin(margins.top2(logits))
        return choose(logits, self.sampling, self.generator)

    def pick_rows(self, rows: RowStats, index: torch.Tensor | slice) -> torch.Tensor:
        """`pick` over `rows[index]` read as `RowStats`."""
        if not self.sampling.greedy:
            return choose(rows.logits[index], self.sampling, self.generator)
        margin = rows.margin[index]
        self.note_margin(float(margin.min()) if margin.numel() else float("inf"))
        return rows.token[index]

    def commit(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the first EOS (inclusive) or max_tokens, advancing the grammar over them (it ends
        where it terminates; a token it rejects is not appended, nor what follows); return what was appended."""
        room = self.limits.max_tokens - len(self.output)
        kept = tokens[:room]
        for i, token in enumerate(kept):
            if self.grammar is not None and not self.grammar.is_terminated() and not accepts(self.grammar, token):
                kept = kept[:i]
                break
            if token in self.limits.eos_token_ids:
                kept = kept[: i + 1]
                self.finished = True
                break
        self.output.extend(kept)
        if len(self.output) >= self.limits.max_tokens:
            self.finished = True
        return kept

    @property
    def remaining(self) -> int:
        return self.limits.max_tokens - len(self.output)

    @property
    def room(self) -> int:
        """Positions left from the next token to the end of the context (`Limits.context`)."""
        context = self.limits.context
        return sys.maxsize if context is None else context - self.num_tokens

    def prefill(self) -> Forward:
        """Causal prefill of the whole prompt; its last row gives the first token."""
        return causal_forward(self.prompt, 0, [len(self.prompt) - 1])

    def after_prefill(self, logits: torch.Tensor) -> Outcome:
        first = int(self.pick(logits)[0])
        return Outcome([first], kv_keep=len(self.prompt))

    @abstractmethod
    def plan(self) -> Forward:
        """The method's next forward after the prefill."""

    @abstractmethod
    def update(self, logits: torch.Tensor) -> Outcome:
        """Turn the planned forward's logits into committed tokens and the next window."""


class AutoregressiveDecoder(Decoder):
    """Plain one-token-per-forward decoding: the baseline every lossless method must reproduce."""

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: object = None):
        super().__init__(prompt, sampling, limits)

    def plan(self) -> Forward:
        return causal_forward(self.tokens[self.cache_len :], self.cache_len, [self.num_tokens - self.cache_len - 1])

    def update(self, logits: torch.Tensor) -> Outcome:
        token = int(self.pick(logits)[0])
        return Outcome([token], kv_keep=self.num_tokens - self.cache_len)
