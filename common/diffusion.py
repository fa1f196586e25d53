"""Nemotron-Labs-Diffusion block diffusion (seed 001, section 3.2).

Per block `[seed, mask x (B-1)]`: bidirectional forwards over the cached prefix (KV not kept) reveal the
most confident mask plus every mask whose confidence reaches tau (a slot's logit row per the checkpoint's
`dlm_type`); once the block is revealed one causal forward writes its KV and its last row gives the next seed.
Blocks keep B slots up to the end of the context (slots past `max_tokens` condition the others but are never
emitted), so the output for n tokens is a prefix of that for more; the last block stops once its leading revealed
run covers `max_tokens` or reaches an EOS.
"""

from dataclasses import dataclass

import torch

from common import margins
from common.decoder import Decoder, Limits
from common.draft_layout import DLM_TYPES, draft_rows
from common.errors import require, require_mask_token
from common.row_stats import RowReading, RowStats
from common.sampling import SamplingParams, choose
from common.window import Attention, Forward, Outcome, causal_forward


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


def reveal(rows: RowStats, masked: torch.Tensor, threshold: float, params: SamplingParams,
           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Slots to reveal (top-1 plus all with confidence >= threshold) among `masked`, their tokens, and the
    decision's slack (`common.margins`: thresholds, the top-1 choice, greedy candidates of revealed slots).
    `rows`: the block's rows read with the mask token excluded."""
    if params.greedy:
        candidates, confidence = rows.token, rows.confidence
    else:
        candidates = choose(rows.logits, params, generator)
        confidence = rows.logits.softmax(-1).gather(-1, candidates[:, None]).squeeze(-1)
    confidence = confidence.masked_fill(~masked, -1.0)
    chosen = (confidence >= threshold) & masked
    slack = margins.threshold(confidence[masked], threshold)
    if not chosen.any():
        slack = min(slack, margins.gap(-confidence[masked]))
    chosen[confidence.argmax()] = True
    if params.greedy:
        slack = min(slack, float(rows.margin[chosen].min()))
    return chosen, candidates, slack


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

    def plan(self) -> Forward:
        if self.block is None:
            self._new_block()
        start = self.num_tokens - 1
        if self._masked.any():
            n = self.block.numel()
            return Forward(
                token_ids=self.block.clone(),
                positions=torch.arange(start, start + n),
                logit_rows=draft_rows(n - 1, self.config.dlm_type),
                attention=Attention.BIDIRECTIONAL,
            )
        return causal_forward(self.block.tolist(), start, [self.block.numel() - 1])

    def reads(self, forward: Forward) -> RowReading:
        """Reveal forwards never choose the mask token; the commit forward's last row gives the next seed."""
        return RowReading(self.config.mask_token_id if forward.attention is Attention.BIDIRECTIONAL else None)

    def update(self, rows: RowStats) -> Outcome:
        if self._masked.any():
            chosen, tokens, slack = reveal(rows, self._masked[1:], self.config.confidence_threshold, self.sampling,
                                           self.generator)
            self.note_margin(slack)
            self.block[1:][chosen] = tokens[chosen]
            self._masked[1:] &= ~chosen
            settled = self.block[1 : 1 + self.leading_revealed].tolist()
            if len(settled) >= self.remaining or any(t in self.limits.eos_token_ids for t in settled):
                self.block = None
                return Outcome(settled)
            return Outcome()
        revealed = self.block[1:].tolist()
        seed = int(self.pick_rows(rows, slice(0, 1))[0])
        self.block = None
        return Outcome(revealed + [seed], kv_keep=len(revealed) + 1)

    @property
    def leading_revealed(self) -> int:
        """Revealed slots before the block's first mask: final, whatever the rest of the block becomes."""
        return int((~self._masked[1:]).long().cumprod(0).sum())
