"""Nemotron-Labs-Diffusion block diffusion (seed 001, section 3.2).

Per block `[seed, mask x (B-1)]`: bidirectional forwards over the cached prefix (KV not kept) reveal the
most confident mask plus every mask whose confidence reaches tau (a slot's logit row per the checkpoint's
`dlm_type`); once the block is revealed one causal forward writes its KV and its last row gives the next seed.
Blocks keep B slots up to the end of the context (slots past `max_tokens` condition the others but are never
emitted), so the output for n tokens is a prefix of that for more; the last block stops once its leading revealed
run covers `max_tokens` or reaches an EOS.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.draft_layout import DLM_TYPES, draft_rows
from parallel_decoding.common.errors import require, require_mask_token
from parallel_decoding.common.grammar import Grammar, valid_prefix
from parallel_decoding.common.row_stats import RowReading, RowStats, padded
from parallel_decoding.common.sampling import SamplingParams, choose
from parallel_decoding.common.window import Attention, Forward, Outcome, causal_forward


@dataclass(frozen=True)
class DiffusionConfig:
    """Blocks of `block_size` (seed included); `dlm_type` as in `common.draft_layout` (unset: the checkpoint's)."""

    block_size: int = 32
    confidence_threshold: float = 0.9
    mask_token_id: int | None = None
    dlm_type: str | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.block_size, int) and self.block_size >= 2, "block_size", "an integer >= 2",
                self.block_size)
        require(0 < self.confidence_threshold <= 1, "confidence_threshold", "in (0, 1]", self.confidence_threshold)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)
        require(self.dlm_type is None or self.dlm_type in DLM_TYPES, "dlm_type", f"one of {list(DLM_TYPES)}",
                self.dlm_type)


def reveal(confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request (row) of a block's slots [R, S]: the slots to reveal, its most confident mask plus every mask
    whose candidate's confidence reaches its `threshold`, and the decision's slack (`common.margins`: thresholds,
    the top-1 choice)."""
    confidence = confidence.masked_fill(~masked, -1.0)
    chosen = (confidence >= threshold[:, None]) & masked
    slack = margins.threshold_rows(confidence, masked, threshold)
    none = ~chosen.any(-1)
    slack = torch.where(none, torch.minimum(slack, margins.gap_rows(-confidence, masked)), slack)
    chosen |= torch.arange(confidence.shape[-1]) == confidence.argmax(-1, keepdim=True)
    return chosen, slack


class DiffusionDecoder(Decoder):
    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: DiffusionConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.block: torch.Tensor | None = None
        self._masked = torch.zeros(0, dtype=torch.bool)

    def _new_block(self) -> None:
        size = min(self.config.block_size - 1, self.room)
        self.block = torch.tensor([self.last_token] + [self.config.mask_token_id] * size)
        self._masked = torch.tensor([False] + [True] * size)

    @property
    def leading_revealed(self) -> int:
        """Revealed slots before the block's first mask (the seed not counted)."""
        masked = self._masked[1:].tolist()
        return masked.index(True) if True in masked else len(masked)

    def settle(self, grammar: Grammar) -> None:
        """The first revealed slot the grammar rejects after the ones before it is masked again (its row was open)."""
        if self.block is None:
            return
        run = self.leading_revealed
        valid = valid_prefix(grammar, self.block[1 : 1 + run].tolist())
        if valid < run:
            self.block[1 + valid], self._masked[1 + valid] = self.config.mask_token_id, True

    def plan(self) -> Forward:
        if self.block is None:
            self._new_block()
        start = self.num_tokens - 1
        if self.revealing:
            n = self.block.numel()
            return Forward(
                token_ids=self.block.clone(),
                positions=torch.arange(start, start + n),
                logit_rows=draft_rows(n - 1, self.config.dlm_type),
                attention=Attention.BIDIRECTIONAL,
                targets=torch.arange(start + 1, start + n),
            )
        return causal_forward(self.block.tolist(), start, [self.block.numel() - 1])

    def reads(self, forward: Forward) -> RowReading:
        """Reveal forwards never choose the mask token; the commit forward's last row gives the next seed."""
        return RowReading(self.config.mask_token_id if forward.attention is Attention.BIDIRECTIONAL else None,
                          scores=True)  # confidence

    @property
    def revealing(self) -> bool:
        """Whether the block still has masks (its next forward reveals; else it commits)."""
        return bool(self._masked.any())

    def update(self, rows: RowStats) -> Outcome:
        return self.update_batch([self], rows, [len(rows)])[0]

    @classmethod
    def update_batch(cls, decoders: Sequence["DiffusionDecoder"], rows: RowStats, sizes: Sequence[int]
                     ) -> list[Outcome]:
        """Blocks still revealing decide together over their slots; a revealed block commits with its next seed."""
        starts = list(accumulate(sizes, initial=0))
        outcomes = [Outcome() for _ in decoders]
        revealing = []
        for i, decoder in enumerate(decoders):
            if decoder.revealing:
                revealing.append(i)
            else:
                revealed = decoder.block[1:].tolist()
                seed = int(decoder.pick_rows(rows.part(starts[i], starts[i + 1]), slice(0, 1))[0])
                decoder.block = None
                outcomes[i] = Outcome(revealed + [seed], kv_keep=len(revealed) + 1)
        if revealing:
            for i, outcome in zip(revealing, cls._reveal(decoders, rows, sizes, revealing), strict=True):
                outcomes[i] = outcome
        return outcomes

    @staticmethod
    def _reveal(decoders: Sequence["DiffusionDecoder"], rows: RowStats, sizes: Sequence[int], index: list[int]
                ) -> list[Outcome]:
        """One reveal for each of the decoders `index` names: a greedy block takes its slots' argmax candidates, a
        sampled one draws them; the block's leading revealed run is final."""
        at, starts = torch.tensor(index), list(accumulate(sizes, initial=0))
        decoders = [decoders[i] for i in index]
        widths = [sizes[i] for i in index]
        (token, valid), (confidence, _), (margin, _) = (padded(t, sizes, fill) for t, fill in (
            (rows.token, 0), (rows.confidence, -1.0), (rows.margin, float("inf"))))
        token, valid, confidence, margin = (t[at] for t in (token, valid, confidence, margin))
        for j, (i, decoder) in enumerate(zip(index, decoders, strict=True)):
            assert decoder.block.numel() == widths[j] + 1, "a reveal's rows are its block's slots'"
            if not decoder.sampling.greedy:
                logits = rows.logits[starts[i] : starts[i + 1]]
                candidates = choose(logits, decoder.sampling, decoder.generator)
                token[j, : widths[j]] = candidates
                confidence[j, : widths[j]] = logits.softmax(-1).gather(-1, candidates[:, None])[:, 0]
                margin[j] = float("inf")
        masked = padded(torch.cat([decoder._masked[1:] for decoder in decoders]), widths, False)[0]
        threshold = torch.tensor([decoder.config.confidence_threshold for decoder in decoders])
        chosen, slack = reveal(confidence, masked, threshold)
        slack = torch.minimum(slack, margin.masked_fill(~chosen, float("inf")).amin(-1))
        tail = torch.where(chosen, token, padded(torch.cat([d.block[1:] for d in decoders]), widths, 0)[0])
        masked &= ~chosen
        leading = (~masked & valid).long().cumprod(-1).sum(-1)
        outcomes = []
        for j, (decoder, slots, run, decision) in enumerate(zip(
                decoders, tail.tolist(), leading.tolist(), slack.tolist(), strict=True)):
            decoder.block[1:] = tail[j, : widths[j]]
            decoder._masked[1:] = masked[j, : widths[j]]
            decoder.note_margin(decision)
            if decoder.grammar is not None:
                decoder.settle(decoder.grammar)
                run = decoder.leading_revealed
            settled = slots[:run]
            if len(settled) >= decoder.remaining or any(t in decoder.limits.eos_token_ids for t in settled):
                decoder.block = None
                outcomes.append(Outcome(settled))
            else:
                outcomes.append(Outcome())
        return outcomes
