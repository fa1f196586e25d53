"""WeDLM streaming parallel decoding (seed 003, section 5, Algorithm 1).

W slots pinned to logical positions after the committed prefix. Each step forwards filled slots first and
masks after, RoPE on the logical positions, under plain causal attention over the cache; the leading
filled run is committed with the KV it just wrote. A mask slot's logits predict that slot's own token; the
masks whose entropy + lambda * distance falls below tau are filled (else the single best), and new masks
refill the window.
"""

from dataclasses import dataclass

import torch

from common import margins
from common.decoder import Decoder, Limits
from common.errors import require, require_mask_token
from common.row_stats import RowReading, RowStats
from common.sampling import SamplingParams
from common.window import Forward, Outcome, causal_forward


@dataclass(frozen=True)
class WeDLMConfig:
    window: int = 16
    entropy_threshold: float | None = 0.4
    distance_penalty: float = 0.02
    mask_token_id: int | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.window, int) and self.window >= 1, "window", "a positive integer", self.window)
        tau = self.entropy_threshold
        require(tau is None or tau > 0, "entropy_threshold", "> 0 or null (one token per step)", tau)
        require(self.distance_penalty >= 0, "distance_penalty", ">= 0", self.distance_penalty)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)


def select_masks(entropy: torch.Tensor, slots: torch.Tensor, threshold: float | None, penalty: float
                 ) -> tuple[torch.Tensor, float]:
    """Boolean over mask rows: entropy + penalty * (slot distance to the leftmost mask) below tau, else the best;
    and the decision's slack (`common.margins`)."""
    adjusted = entropy + penalty * (slots - slots[0]).float()
    chosen = adjusted < threshold if threshold is not None else torch.zeros_like(adjusted, dtype=torch.bool)
    slack = margins.threshold(adjusted, threshold) if threshold is not None else float("inf")
    if not chosen.any():
        chosen[adjusted.argmin()] = True
        slack = min(slack, margins.gap(adjusted))
    return chosen, slack


class WeDLMDecoder(Decoder):
    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: WeDLMConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.slots: list[int] = []
        self.filled: list[bool] = []

    @property
    def leading_filled(self) -> int:
        """Filled slots before the first mask: committed by the next forward."""
        count = 0
        while count < len(self.filled) and self.filled[count]:
            count += 1
        return count

    @property
    def order(self) -> list[int]:
        """Physical order of the slots: filled first, masks after, each in slot order."""
        return [i for i, f in enumerate(self.filled) if f] + [i for i, f in enumerate(self.filled) if not f]

    def prefill(self) -> Forward:
        return causal_forward(self.prompt, 0, [])

    def after_prefill(self, logits: torch.Tensor) -> Outcome:
        self._refill(0)
        return Outcome(kv_keep=len(self.prompt))

    def _refill(self, committing: int) -> None:
        """Append masks so that, once `committing` slots leave, the window holds W slots: W to the end, also past
        `max_tokens` (fills there are never emitted), so the output for n tokens is a prefix of that for more; never
        past the context."""
        extra = max(min(self.config.window + committing, self.room) - len(self.slots), 0)
        self.slots += [self.config.mask_token_id] * extra
        self.filled += [False] * extra

    def plan(self) -> Forward:
        self._refill(self.leading_filled)
        order = self.order
        n_filled = sum(self.filled)
        return Forward(
            token_ids=torch.tensor([self.slots[i] for i in order]),
            positions=torch.tensor(order) + self.num_tokens,
            logit_rows=torch.arange(n_filled, len(order)),
        )

    def reads(self, forward: Forward) -> RowReading:
        return RowReading()

    def update(self, rows: RowStats) -> Outcome:
        p = self.leading_filled
        committed = self.slots[:p]
        masks = [i - p for i, f in enumerate(self.filled) if not f]
        self.slots, self.filled = self.slots[p:], self.filled[p:]
        ends = any(t in self.limits.eos_token_ids for t in committed) or p >= self.remaining
        if masks and not ends:
            slots = torch.tensor(masks)
            chosen, slack = select_masks(rows.entropy, slots, self.config.entropy_threshold,
                                         self.config.distance_penalty)
            self.note_margin(slack)
            tokens = self.pick_rows(rows, chosen).tolist()
            for slot, token in zip(slots[chosen].tolist(), tokens, strict=True):
                self.slots[slot] = token
                self.filled[slot] = True
        return Outcome(committed, kv_keep=p)
