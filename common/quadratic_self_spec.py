"""NLD quadratic self-speculation (seed 001, section 3.4, appendix C): one forward verifies the previous drafts
causally and drafts the next block for every point where that verification may stop.

Rows: the causal chain `[seed, d_1 .. d_m]` (seed: the last committed token, not cached yet), then for each chain
token a group `[that token, mask x k]` at its position onward, seeing the chain strictly before it and itself
bidirectionally: the layout of linear self-speculation's draft forward, so the same training serves. Verification
is linear self-speculation's (exact match plus bonus when greedy, speculative rejection sampling with the drafts'
proposal otherwise). The group of the last accepted token drafts the next step: its slots after the bonus, so
m = k - 1 drafts per step, at one forward per step. The forward is m (k + 2) rows long: where that would run past
the context (`Limits.context`, an engine's model length), the step drafts less, or forwards the chain alone.

An engine's width planner (`common.width_planner`) may cap the drafts per step at w < k - 1 (`cap`): the step
then verifies at most w drafts and lays groups of w + 1 masks, (w + 1)(w + 3) rows; w = 0 forwards the chain alone,
a plain AR step. The output does not depend on it.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from parallel_decoding.common.acceptance import accept_greedy_batch, verify
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER, draft_width, propose
from parallel_decoding.common.draft_layout import DLM_TYPES, draft_rows
from parallel_decoding.common.errors import require, require_mask_token
from parallel_decoding.common.row_stats import RowReading, RowStats
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import Attention, Forward, Outcome


@dataclass(frozen=True)
class QuadraticSelfSpecConfig:
    """`block_size` k: mask slots per group (k - 1 drafts verified per step); `dlm_type` as in
    `common.draft_layout` (unset: the checkpoint's); `draft_adapter` a LoRA applied to the groups' rows only (the
    chain's rows, which verify, see no group row, so they stay the base model's exactly)."""

    block_size: int = 8
    mask_token_id: int | None = None
    dlm_type: str | None = None
    draft_adapter: str | None = None

    def __post_init__(self) -> None:
        k = self.block_size
        require(isinstance(k, int) and k >= 2, "block_size", "an integer >= 2", k)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)
        require(self.dlm_type is None or self.dlm_type in DLM_TYPES, "dlm_type", f"one of {list(DLM_TYPES)}",
                self.dlm_type)


@dataclass(frozen=True)
class QuadraticLayout:
    """A quadratic forward's shape for a chain of m tokens: each row's token (`source`: a chain index, or m for the
    mask token), its position past the chain's first, the logit rows and which rows see which. Every step with m
    chain tokens shares it, so it is laid once (read-only)."""

    source: torch.Tensor
    offsets: torch.Tensor
    logit_rows: torch.Tensor
    visible: torch.Tensor
    targets: torch.Tensor  # the position each logit row predicts, past the chain's first


@functools.cache
def quadratic_layout(m: int, block_size: int, dlm_type: str | None, grouped: bool) -> QuadraticLayout:
    """The layout of a chain of m tokens, with a group of `block_size` masks per chain token or (not `grouped`)
    the chain alone."""
    index = torch.arange(m)
    if not grouped:
        return QuadraticLayout(index, index, index, torch.ones(m, m, dtype=torch.bool).tril(), index + 1)
    g = block_size + 1
    group, slot = index.repeat_interleave(g), torch.arange(g).repeat(m)  # each group row's chain token and slot
    owner = torch.cat([index, group])  # a chain row's own index, a group row's chain token
    in_group = torch.arange(m + m * g) >= m
    # Chain rows see the chain causally; group rows the chain strictly before their token, and their own group.
    before = owner[None, :] < owner[:, None] + (~in_group)[:, None].long()
    same_group = in_group[:, None] & in_group[None, :] & (owner[:, None] == owner[None, :])
    rows = torch.cat([index, (m + index[:, None] * g + draft_rows(block_size, dlm_type)).flatten()])
    targets = torch.cat([index + 1, (index[:, None] + torch.arange(1, block_size + 1)).flatten()])
    return QuadraticLayout(torch.cat([index, torch.where(slot == 0, group, m)]), torch.cat([index, group + slot]),
                           rows, (~in_group[None, :] & before) | same_group, targets)


def quadratic_forward(chain: list[int], start: int, config: QuadraticSelfSpecConfig, grouped: bool = True,
                      masks: int | None = None) -> Forward:
    """The chain at positions `start ..`, then (if `grouped`) one group per chain token; logit rows: the chain's,
    then each group's slots (`masks` of them, k unless given); the draft adapter (if any) on the group rows."""
    layout = quadratic_layout(len(chain), masks or config.block_size, config.dlm_type, grouped)
    ids = torch.tensor([*chain, config.mask_token_id])[layout.source]
    adapter = DRAFT_ADAPTER if config.draft_adapter and grouped else None
    rows = torch.arange(len(chain), len(layout.source)) if adapter else None
    return Forward(ids, layout.offsets + start, layout.logit_rows, Attention.CUSTOM, layout.visible, adapter, rows,
                   layout.targets + start)


class QuadraticSelfSpecDecoder(Decoder):
    """Each forward commits the accepted drafts plus one token and proposes the next drafts."""

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: QuadraticSelfSpecConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.drafts = torch.zeros(0, dtype=torch.long)
        self.draft_probs: torch.Tensor | None = None
        self.draft_cap: int | None = None  # an engine's width planner's, set before each forward
        self.group_masks = config.block_size  # mask slots per group in the planned forward (0: the chain alone)
        self.verified = (0, 0)  # the last step's drafts verified and accepted, for an engine's planner

    @property
    def most_drafts(self) -> int:
        return self.config.block_size - 1

    @property
    def width(self) -> int:
        """Drafts the next forward verifies at most and drafts for the step after: k - 1, or the planner's cap."""
        return self.most_drafts if self.draft_cap is None else max(min(self.draft_cap, self.most_drafts), 0)

    def cap(self, width: int) -> None:
        """An engine's width planner's cap on the next forward (`common.width_planner.cap_widths`)."""
        self.draft_cap = width

    def pause(self) -> None:
        self.drafts, self.draft_probs, self.group_masks = torch.zeros(0, dtype=torch.long), None, 0

    def groups_fit(self, chain_len: int, start: int, masks: int) -> int:
        """How many of a chain's tokens can have their group of `masks` slots in a forward from `start` (rows
        past the context cannot be laid)."""
        context, rows = self.limits.context, masks + 2
        return chain_len if context is None else max(min(chain_len, (context - start) // rows), 0)

    def plan(self) -> Forward:
        width = self.width
        if self.drafts.numel() > width:
            self.drafts = self.drafts[:width]
            self.draft_probs = None if self.draft_probs is None else self.draft_probs[:width]
        chain, start = [self.last_token] + self.drafts.tolist(), self.num_tokens - 1
        grouped = width > 0 and self.groups_fit(len(chain), start, width + 1) == len(chain)
        self.group_masks = width + 1 if grouped else 0
        return quadratic_forward(chain, start, self.config, grouped, width + 1)

    def reads(self, forward: Forward) -> RowReading:
        """The chain's rows verify; the groups' slots draft, never the mask token."""
        return RowReading(self.config.mask_token_id, from_row=self.drafts.numel() + 1)

    def update(self, rows: RowStats) -> Outcome:
        return self.update_batch([self], rows, [len(rows)])[0]

    @classmethod
    def update_batch(cls, decoders: Sequence["QuadraticSelfSpecDecoder"], rows: RowStats, sizes: Sequence[int]
                     ) -> list[Outcome]:
        """Each decoder verifies its chain and drafts from its last accepted token's group. The greedy decoders'
        chains are matched in one pass over the batch, and their next drafts and decision margins gathered in one
        more; sampling decoders verify and propose on their own rows."""
        starts = list(accumulate(sizes, initial=0))
        greedy = [i for i, decoder in enumerate(decoders) if decoder.sampling.greedy]
        decided: dict[int, tuple[list[int], torch.Tensor]] = {}
        if greedy:
            first = torch.tensor([starts[i] for i in greedy])
            chains = torch.tensor([decoders[i].drafts.numel() + 1 for i in greedy])
            chain_rows = first[:, None] + torch.minimum(torch.arange(int(chains.max()))[None, :], chains[:, None] - 1)
            accepted = accept_greedy_batch([decoders[i].drafts.tolist() for i in greedy], rows.token[chain_rows])
            lengths = torch.tensor([len(tokens) for tokens in accepted])
            widths = torch.tensor([decoders[i].next_width(len(tokens))
                                   for i, tokens in zip(greedy, accepted, strict=True)])
            # Slots 1 .. width of the last accepted token's group (past the bonus), padded with a chain row.
            k = torch.tensor([decoders[i].group_masks for i in greedy])
            slots = torch.arange(1, int(widths.max()) + 1)[None, :]
            group = first + chains + (lengths - 1) * k
            slot_rows = torch.where(slots <= widths[:, None], group[:, None] + slots, chain_rows[:, -1:])
            margin = torch.cat([rows.margin[chain_rows], rows.margin[slot_rows]], 1).amin(1).tolist()
            drafts = rows.token[slot_rows]
            for j, i in enumerate(greedy):
                decoders[i].note_margin(margin[j])
                decided[i] = accepted[j], drafts[j, : int(widths[j])]
        return [decoder._verified(*decided[i]) if i in decided
                else decoder._verified(None, None, rows.part(starts[i], starts[i + 1]))
                for i, decoder in enumerate(decoders)]

    def next_width(self, num_committed: int) -> int:
        """Drafts the next step verifies, after this step's forward committed `num_committed` tokens: none from a
        chain forwarded alone."""
        masks = self.group_masks
        if masks == 0:
            return 0
        start = self.num_tokens + num_committed - 1
        return max(min(draft_width(masks - 1, self.remaining - num_committed),
                       self.groups_fit(masks, start, masks) - 1), 0)

    def _verified(self, committed: list[int] | None, drafts: torch.Tensor | None, rows: RowStats | None = None
                  ) -> Outcome:
        """This decoder's step given what a greedy decision found (`committed`, the next `drafts`), or (sampling)
        verifying its drafts and proposing the next ones itself from its own `rows`."""
        m = self.drafts.numel() + 1
        if committed is None:
            assert rows is not None
            committed = verify(self.drafts, rows.logits[:m], self.sampling, self.generator, self.draft_probs)
            width = self.next_width(len(committed))
            slots = m + (len(committed) - 1) * self.group_masks + torch.arange(1, width + 1)
            drafts, probs = (propose(rows.logits[slots], self.config.mask_token_id, self.sampling, self.generator)
                             if width else (torch.zeros(0, dtype=torch.long), None))
        else:
            probs = None
        self.acceptance.record(m - 1, len(committed) - 1)
        self.verified = (m - 1, len(committed) - 1)
        self.drafts, self.draft_probs = drafts, probs
        return Outcome(committed, kv_keep=len(committed))

