"""Nemotron-Labs-Diffusion linear self-speculation: a bidirectional draft pass, then a causal verify pass.

Draft: `[seed, mask x k]` with bidirectional attention inside the block over the cached prefix, KV not
kept, slots read on the rows the checkpoint's `dlm_type` says, mask token never drafted. Verify:
`[seed, drafts]` causal; exact match plus bonus when greedy, speculative rejection sampling with the
draft's probabilities otherwise.
"""

from dataclasses import dataclass

import torch

from parallel_decoding.common import margins
from parallel_decoding.common.acceptance import verify
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.draft_layout import DLM_TYPES, draft_rows
from parallel_decoding.common.errors import require, require_mask_token
from parallel_decoding.common.sampling import SamplingParams, target_probs, without_token
from parallel_decoding.common.width_planner import Shape, check_step_cost
from parallel_decoding.common.window import Attention, Forward, Outcome, causal_forward

DRAFT_ADAPTER = "draft"
MODES = ("linear", "quadratic")


@dataclass(frozen=True)
class DiffusionSelfConfig:
    """`num_speculative_tokens` drafts verified per step; `draft_adapter` names a LoRA used only when drafting (in mode
    quadratic: on the draft groups' rows of the verify forward only); `dlm_type` says which logit row drafts a slot (see
    `common.draft_layout`; unset: the checkpoint's). `mode` `linear` drafts in a forward of its own; `quadratic` drafts
    inside the verify forward (`common.quadratic_self_spec`, with `num_speculative_tokens` + 1 mask slots per group). In
    the engines (and in the reference runner where set to true: `common.runner_widths`) `adaptive` (default on) drafts
    each step only as many tokens per request as pay for their rows, none when no draft would (a plain AR step:
    `common.width_planner`); false drafts `num_speculative_tokens` always; `step_cost` fixes the cost model instead of
    measuring it."""

    num_speculative_tokens: int = 31
    mask_token_id: int | None = None
    draft_adapter: str | None = None
    dlm_type: str | None = None
    mode: str = "linear"
    adaptive: bool | None = None
    step_cost: list[float] | None = None

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        require(isinstance(k, int) and k >= 1, "num_speculative_tokens", "a positive integer", k)
        require(self.mask_token_id is None or self.mask_token_id >= 0, "mask_token_id", "a token id >= 0",
                self.mask_token_id)
        require(self.dlm_type is None or self.dlm_type in DLM_TYPES, "dlm_type", f"one of {list(DLM_TYPES)}",
                self.dlm_type)
        require(self.mode in MODES, "mode", f"one of {list(MODES)}", self.mode)
        require(self.adaptive in (None, True, False), "adaptive", "true or false", self.adaptive)
        check_step_cost(self.step_cost)

    @property
    def adapts(self) -> bool:
        """Whether the engines choose the widths by load (default: yes)."""
        return self.adaptive is not False

    @property
    def planned_width(self) -> int:
        """The most drafts a width planner gives a request a step."""
        return self.num_speculative_tokens

    def shape(self, uniform: bool = False) -> Shape:
        """How a step spends rows on drafts, for a width planner (`common.width_planner.planner_for`): a draft
        forward of its own (linear) or (w + 1)(w + 3) rows in the verify forward (quadratic)."""
        quadratic = self.mode == "quadratic"
        return Shape(extra_forward=not quadratic, quadratic=quadratic, uniform=uniform)


def draft_distribution(logits: torch.Tensor, mask_token_id: int, params: SamplingParams) -> torch.Tensor:
    """The proposal q the drafts are sampled from: the processed distribution with the mask token removed."""
    return target_probs(without_token(logits, mask_token_id), params)


def draft_width(num_speculative_tokens: int, remaining: int) -> int:
    """Drafts this step: never more than the tokens still allowed after the bonus."""
    return max(min(num_speculative_tokens, remaining - 1), 0)


def draft_window(seed: int, seed_position: int, width: int, config: DiffusionSelfConfig) -> Forward:
    """The draft forward: `[seed, mask x width]` from the seed's position, bidirectional, one logit row per mask."""
    return Forward(
        token_ids=torch.tensor([seed] + [config.mask_token_id] * width),
        positions=torch.arange(seed_position, seed_position + width + 1),
        logit_rows=draft_rows(width, config.dlm_type),
        attention=Attention.BIDIRECTIONAL,
        adapter=DRAFT_ADAPTER if config.draft_adapter else None,
        targets=torch.arange(seed_position + 1, seed_position + width + 1),
    )


def propose(
    logits: torch.Tensor, mask_token_id: int, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drafts from the draft forward's logit rows and the proposal q they were drawn from (greedy: the argmax,
    the mask token excluded, and no q: greedy verification reads none)."""
    if params.greedy:
        return without_token(logits, mask_token_id).argmax(-1), None
    probs = draft_distribution(logits, mask_token_id, params)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs


class DiffusionSelfDecoder(Decoder):
    """Alternates draft and verify forwards; each verify commits 1..k+1 tokens."""

    def __init__(self, prompt: list[int], sampling: SamplingParams, limits: Limits, config: DiffusionSelfConfig):
        require_mask_token(config.mask_token_id)
        super().__init__(prompt, sampling, limits)
        self.config = config
        self.drafts: torch.Tensor | None = None
        self.draft_probs: torch.Tensor | None = None
        self.draft_cap: int | None = None  # a width planner's, set before each step (the reference runner's)
        self.verified = (0, 0)  # the last step's drafts verified and accepted, for that planner

    @property
    def most_drafts(self) -> int:
        return self.config.num_speculative_tokens

    @property
    def width(self) -> int:
        cap = self.most_drafts if self.draft_cap is None else max(min(self.draft_cap, self.most_drafts), 0)
        return draft_width(cap, self.remaining)

    def cap(self, width: int) -> None:
        """A width planner's cap on the next step's drafts (`common.width_planner.cap_widths`); 0 skips the draft
        forward, a plain AR step."""
        self.draft_cap = width

    @property
    def seed_position(self) -> int:
        return self.num_tokens - 1

    def plan(self) -> Forward:
        seed = self.last_token
        if self.drafts is None and self.width > 0:
            return draft_window(seed, self.seed_position, self.width, self.config)
        drafts = [] if self.drafts is None else self.drafts.tolist()
        return causal_forward([seed] + drafts, self.seed_position, list(range(len(drafts) + 1)))

    def update(self, logits: torch.Tensor) -> Outcome:
        if self.drafts is None and self.width > 0:
            if self.sampling.greedy:
                self.note_margin(margins.top2(without_token(logits, self.config.mask_token_id)))
            self.drafts, self.draft_probs = propose(logits, self.config.mask_token_id, self.sampling, self.generator)
            return Outcome()
        drafts = self.drafts if self.drafts is not None else torch.zeros(0, dtype=torch.long)
        if self.sampling.greedy:
            self.note_margin(margins.top2(logits))
        committed = verify(drafts, logits, self.sampling, self.generator, self.draft_probs)
        self.acceptance.record(drafts.numel(), len(committed) - 1)
        self.verified = (drafts.numel(), len(committed) - 1)
        self.drafts = self.draft_probs = None
        return Outcome(committed, kv_keep=len(committed))
