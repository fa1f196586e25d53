"""WeDLM-drafted lossless speculation: a WeDLM checkpoint's causal mask decoding drafts, its AR rows verify.

One causal forward per step over `[seed, d_1 .. d_m, mask x window]` at consecutive positions (seed: the
last committed token, not cached yet). The seed and draft rows are the model's AR distributions and verify the
drafts (exact match plus bonus when greedy, speculative rejection sampling with the drafts' proposal otherwise), so
the output is the model's own AR distribution. The mask rows, each predicting its own slot as WeDLM trains them,
draw the next step's drafts: the slots after the bonus, used when every draft was accepted (the masks saw the
drafts); after a rejection the next step drafts afresh, still committing its seed row's token.

An engine's width planner (`common.width_planner`) may cap a step at w < window - 1 drafts (`cap`): at most w drafts
verified and w + 1 mask slots; w = 0 forwards the seed alone, a plain AR step. The output does not depend on it.
"""

from dataclasses import dataclass

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.acceptance import verify
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.diffusion_self import draft_width, propose
from parallel_decoding.common.errors import require, require_mask_token
from parallel_decoding.common.sampling import SamplingParams, without_token
from parallel_decoding.common.width_planner import Shape, check_step_cost
from parallel_decoding.common.window import Forward, Outcome, causal_forward


@dataclass(frozen=True)
class WeDLMSpecConfig:
    """`window`: mask slots forwarded after the drafts, the bonus's and the next drafts' (so up to window - 1 drafts are
    verified per step). In the engines (and in the reference runner where set to true: `common.runner_widths`)
    `adaptive` (default on) caps each step's drafts and slots per request at what pays for their rows
    (`common.width_planner`); false keeps the window; `step_cost` fixes the cost model instead of measuring it."""

    window: int = 16
    mask_token_id: int | None = None
    adaptive: bool | None = None
    step_cost: list[float] | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.window, int) and self.window >= 2, "window",
                "an integer >= 2 (the bonus slot, then at least one draft)", self.window)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)
        require(self.adaptive in (None, True, False), "adaptive", "true or false", self.adaptive)
        check_step_cost(self.step_cost)

    @property
    def adapts(self) -> bool:
        """Whether the engines choose the widths by load (default: yes)."""
        return self.adaptive is not False

    @property
    def planned_width(self) -> int:
        """The most drafts a width planner gives a request a step (the rest of the window is its mask slots)."""
        return self.window - 1

    def shape(self, uniform: bool = False) -> Shape:
        """How a step spends rows on drafts, for a width planner (`common.width_planner.planner_for`): the next
        drafts' mask slots in the verify forward itself."""
        return Shape(mask_slots=True, uniform=uniform)


class WeDLMSpecDecoder(Decoder):
    """Each forward commits the accepted drafts plus one token and, when all were accepted, drafts the next."""

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: WeDLMSpecConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.drafts = torch.zeros(0, dtype=torch.long)
        self.draft_probs: torch.Tensor | None = None
        self.draft_cap: int | None = None  # an engine's width planner's
        self.verified = (0, 0)  # the last step's drafts verified and accepted, for an engine's planner

    @property
    def most_drafts(self) -> int:
        return self.config.window - 1

    def cap(self, width: int) -> None:
        """An engine's width planner's cap on the next forward (`common.width_planner.cap_widths`): at most `width`
        drafts, `width` + 1 mask slots."""
        self.draft_cap = width
        if self.drafts.numel() > width:
            self.drafts = self.drafts[:width]
            self.draft_probs = None if self.draft_probs is None else self.draft_probs[:width]

    @property
    def masks(self) -> int:
        """Mask slots after the drafts: the bonus's slot and the next drafts', none past what can still be
        committed or past the context, nor past the planner's cap (none at 0)."""
        m = self.drafts.numel()
        useful = 1 + draft_width(self.config.window - 1, self.remaining - m - 1)
        capped = self.config.window if self.draft_cap is None else self.draft_cap + (self.draft_cap > 0)
        return max(min(self.config.window, useful, self.room - m, capped), 0)

    def plan(self) -> Forward:
        tokens, start = [self.last_token, *self.window_tokens], self.num_tokens - 1
        positions = torch.arange(start, start + len(tokens))
        chain = torch.arange(len(tokens)) <= self.drafts.numel()  # its rows predict the next; a mask its own slot
        return causal_forward(tokens, start, list(range(len(tokens))), targets=positions + chain.long())

    def update(self, logits: torch.Tensor) -> Outcome:
        m = self.drafts.numel()
        chain = logits[: m + 1]
        if self.sampling.greedy:
            self.note_margin(margins.top2(chain))
        committed = verify(self.drafts, chain, self.sampling, self.generator, self.draft_probs)
        self.next_drafts(committed, logits[m + 2 :])
        return Outcome(committed, kv_keep=len(committed))

    def next_drafts(self, committed: list[int], slots: torch.Tensor) -> None:
        """After a verification that commits `committed` (not yet appended): the next drafts from `slots`, the
        mask rows past the bonus's own slot, when every draft was accepted; none otherwise (also when an engine's
        verifier went on past the bonus, having drawn the mask token itself there)."""
        m = self.drafts.numel()
        self.acceptance.record(m, min(len(committed) - 1, m))
        self.verified = (m, min(len(committed) - 1, m))
        self.drafts, self.draft_probs = torch.zeros(0, dtype=torch.long), None
        width = min(draft_width(self.config.window - 1, self.remaining - len(committed)), slots.shape[0],
                    self.room - len(committed) - 1)
        if len(committed) == m + 1 and width > 0:
            if self.sampling.greedy:
                self.note_margin(margins.top2(without_token(slots[:width], self.config.mask_token_id)))
            self.drafts, self.draft_probs = propose(slots[:width], self.config.mask_token_id, self.sampling,
                                                    self.generator)

    def follow(self, committed: list[int], slots: torch.Tensor) -> None:
        """Keep up with an engine whose verifier committed `committed` on this decoder's window (the engine holds
        the KV): the next drafts as `update` makes them, then the tokens appended."""
        self.next_drafts(committed, slots)
        self.commit(committed)

    @property
    def window_tokens(self) -> list[int]:
        """What follows the seed in the next forward: the drafts, then the mask slots."""
        return self.drafts.tolist() + [self.config.mask_token_id] * self.masks
