"""NLD quadratic self-speculation (seed 001, section 3.4, appendix C): one forward verifies the previous drafts
causally and drafts the next block for every point where that verification may stop.

Rows: the causal chain `[seed, d_1 .. d_m]` (seed: the last committed token, not cached yet), then for each chain
token a group `[that token, mask x k]` at its position onward, seeing the chain strictly before it and itself
bidirectionally: the layout of linear self-speculation's draft forward, so the same training serves. Verification
is linear self-speculation's (exact match plus bonus when greedy, speculative rejection sampling with the drafts'
proposal otherwise). The group of the last accepted token drafts the next step: its slots after the bonus, so
m = k - 1 drafts per step, at one forward per step. The forward is m (k + 2) rows long: where that would run past
the context (`Limits.context`, an engine's model length), the step drafts less, or forwards the chain alone.
"""

from dataclasses import dataclass

import torch

from common.acceptance import accept_greedy, verify
from common.decoder import Decoder, Limits
from common.diffusion_self import draft_width, propose
from common.draft_layout import DLM_TYPES, draft_rows
from common.errors import require, require_mask_token
from common.row_stats import RowReading, RowStats
from common.sampling import SamplingParams
from common.window import Attention, Forward, Outcome


@dataclass(frozen=True)
class QuadraticSelfSpecConfig:
    """`block_size` k: mask slots per group (k - 1 drafts verified per step); `dlm_type` as in
    `common.draft_layout` (unset: the checkpoint's)."""

    block_size: int = 8
    mask_token_id: int | None = None
    dlm_type: str | None = None

    def __post_init__(self) -> None:
        k = self.block_size
        require(isinstance(k, int) and k >= 2, "block_size", "an integer >= 2", k)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)
        require(self.dlm_type is None or self.dlm_type in DLM_TYPES, "dlm_type", f"one of {list(DLM_TYPES)}",
                self.dlm_type)


def quadratic_forward(chain: list[int], start: int, config: QuadraticSelfSpecConfig, grouped: bool = True
                      ) -> Forward:
    """The chain at positions `start ..`, then (if `grouped`) one group per chain token; logit rows: the chain's,
    then each group's k slots."""
    k, m = config.block_size, len(chain)
    n = m + m * (k + 1) if grouped else m
    visible = torch.zeros(n, n, dtype=torch.bool)
    visible[:m, :m] = torch.ones(m, m, dtype=torch.bool).tril()
    ids, positions, rows = list(chain), list(range(start, start + m)), list(range(m))
    for a, token in enumerate(chain if grouped else []):
        g = m + a * (k + 1)
        visible[g : g + k + 1, :a] = True
        visible[g : g + k + 1, g : g + k + 1] = True
        ids += [token] + [config.mask_token_id] * k
        positions += range(start + a, start + a + k + 1)
        rows += (g + draft_rows(k, config.dlm_type)).tolist()
    return Forward(torch.tensor(ids), torch.tensor(positions), torch.tensor(rows), Attention.CUSTOM, visible)


class QuadraticSelfSpecDecoder(Decoder):
    """Each forward commits the accepted drafts plus one token and proposes the next drafts."""

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: QuadraticSelfSpecConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.drafts = torch.zeros(0, dtype=torch.long)
        self.draft_probs: torch.Tensor | None = None

    def groups_fit(self, chain_len: int, start: int) -> int:
        """How many of a chain's tokens can have their group in a forward from `start` (rows past the context
        cannot be laid)."""
        context, rows = self.limits.context, self.config.block_size + 2
        return chain_len if context is None else max(min(chain_len, (context - start) // rows), 0)

    def plan(self) -> Forward:
        chain, start = [self.last_token] + self.drafts.tolist(), self.num_tokens - 1
        return quadratic_forward(chain, start, self.config, grouped=self.groups_fit(len(chain), start) == len(chain))

    def reads(self, forward: Forward) -> RowReading:
        """The chain's rows verify; the groups' slots draft, never the mask token."""
        return RowReading(self.config.mask_token_id, from_row=self.drafts.numel() + 1)

    def update(self, rows: RowStats) -> Outcome:
        m, k = self.drafts.numel() + 1, self.config.block_size
        if self.sampling.greedy:
            self.note_margin(float(rows.margin[:m].min()))
            committed = accept_greedy(self.drafts.tolist(), rows.token[:m])
        else:
            committed = verify(self.drafts, rows.logits[:m], self.sampling, self.generator, self.draft_probs)
        self.acceptance.record(self.drafts.numel(), len(committed) - 1)
        self.drafts, self.draft_probs = torch.zeros(0, dtype=torch.long), None
        if len(rows) == m:
            return Outcome(committed, kv_keep=len(committed))
        slots = m + (len(committed) - 1) * k + torch.arange(1, k)  # the last accepted token's group, after the bonus
        start = self.num_tokens + len(committed) - 1
        width = min(draft_width(k - 1, self.remaining - len(committed)), self.groups_fit(k, start) - 1)
        if width > 0 and self.sampling.greedy:
            self.drafts = self.pick_rows(rows, slots[:width])
        elif width > 0:
            self.drafts, self.draft_probs = propose(rows.logits[slots[:width]], self.config.mask_token_id,
                                                    self.sampling, self.generator)
        return Outcome(committed, kv_keep=len(committed))
