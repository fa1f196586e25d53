"""WeDLM streaming parallel decoding (seed 003, section 5, Algorithm 1).

W slots pinned to logical positions after the committed prefix. Each step forwards filled slots first and
masks after, RoPE on the logical positions, under plain causal attention over the cache; the leading
filled run is committed with the KV it just wrote. A mask slot's logits predict that slot's own token; the
masks whose entropy + lambda * distance falls below tau are filled (else the single best), and new masks
refill the window.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.errors import require, require_mask_token
from parallel_decoding.common.grammar import Grammar, valid_prefix
from parallel_decoding.common.row_stats import RowReading, RowStats, padded
from parallel_decoding.common.sampling import SamplingParams, choose
from parallel_decoding.common.window import Forward, Outcome, causal_forward


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


def select_masks(entropy: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor, threshold: torch.Tensor,
                 penalty: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request (row) of mask rows [R, S] (`valid` where one is; `slots` their window slots, leftmost first):
    the masks whose entropy + penalty * (slot distance to the leftmost mask) falls below tau, else the best one;
    and the decision's slack (`common.margins`). `threshold` and `penalty` per request; -inf: no threshold."""
    adjusted = (entropy + penalty[:, None] * (slots - slots[:, :1]).float()).masked_fill(~valid, float("inf"))
    chosen = (adjusted < threshold[:, None]) & valid
    slack = margins.threshold_rows(adjusted, valid, threshold)
    none = ~chosen.any(-1)
    chosen |= none[:, None] & (torch.arange(adjusted.shape[-1]) == adjusted.argmin(-1, keepdim=True))
    return chosen, torch.where(none, torch.minimum(slack, margins.gap_rows(adjusted, valid)), slack)


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

    def settle(self, grammar: Grammar) -> None:
        """The first filled slot the grammar rejects after the ones before it is a mask again (its row was open)."""
        valid = valid_prefix(grammar, self.slots[: self.leading_filled])
        if valid < self.leading_filled:
            self.slots[valid], self.filled[valid] = self.config.mask_token_id, False

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
        positions = torch.tensor(order, dtype=torch.long) + self.num_tokens
        return Forward(
            token_ids=torch.tensor([self.slots[i] for i in order]),
            positions=positions,
            logit_rows=torch.arange(n_filled, len(order)),
            targets=positions[n_filled:],  # a mask row predicts its own slot
        )

    def reads(self, forward: Forward) -> RowReading:
        return RowReading(scores=True)  # entropy

    def update(self, rows: RowStats) -> Outcome:
        return self.update_batch([self], rows, [len(rows)])[0]

    @classmethod
    def update_batch(cls, decoders: Sequence["WeDLMDecoder"], rows: RowStats, sizes: Sequence[int]) -> list[Outcome]:
        """Each decoder commits its leading filled run; the mask selection runs over all requests' mask rows."""
        outcomes, selecting = [], []
        for i, decoder in enumerate(decoders):
            p = decoder.leading_filled
            committed = decoder.slots[:p]
            masks = [j - p for j, f in enumerate(decoder.filled) if not f]
            decoder.slots, decoder.filled = decoder.slots[p:], decoder.filled[p:]
            if masks and not (any(t in decoder.limits.eos_token_ids for t in committed) or p >= decoder.remaining):
                assert len(masks) == sizes[i], "a window's rows are its masks'"
                selecting.append((i, masks))
            outcomes.append(Outcome(committed, kv_keep=p))
        if selecting:
            cls._fill(decoders, rows, sizes, selecting)
        return outcomes

    @staticmethod
    def _fill(decoders: Sequence["WeDLMDecoder"], rows: RowStats, sizes: Sequence[int],
              selecting: list[tuple[int, list[int]]]) -> None:
        """Fill the selected masks of the decoders `selecting` names, each with its window's mask slots."""
        index = torch.tensor([i for i, _ in selecting])
        starts = list(accumulate(sizes, initial=0))
        decoders = [decoders[i] for i, _ in selecting]
        entropy, valid = (t[index] for t in padded(rows.entropy, sizes, float("inf")))
        token, margin = padded(rows.token, sizes, 0)[0][index], padded(rows.margin, sizes, float("inf"))[0][index]
        width = entropy.shape[-1]
        slots = torch.tensor([masks + [0] * (width - len(masks)) for _, masks in selecting])
        config = [decoder.config for decoder in decoders]
        threshold = torch.tensor([float("-inf") if c.entropy_threshold is None else c.entropy_threshold
                                  for c in config])
        chosen, slack = select_masks(entropy, slots, valid, threshold, torch.tensor([c.distance_penalty
                                                                                     for c in config]))
        greedy = torch.tensor([decoder.sampling.greedy for decoder in decoders])
        slack = torch.minimum(slack, margin.masked_fill(~(chosen & greedy[:, None]), float("inf")).amin(-1))
        for decoder, (i, masks), picked, tokens, decision in zip(
                decoders, selecting, chosen.tolist(), token.tolist(), slack.tolist(), strict=True):
            filling = [k for k in range(len(masks)) if picked[k]]
            if decoder.sampling.greedy:
                tokens = [tokens[k] for k in filling]
            else:
                tokens = choose(rows.logits[starts[i] : starts[i + 1]][filling], decoder.sampling,
                                decoder.generator).tolist()
            decoder.note_margin(decision)
            for k, t in zip(filling, tokens, strict=True):
                decoder.slots[masks[k]], decoder.filled[masks[k]] = t, True
