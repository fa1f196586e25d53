"""Per-request sampling parameters and the processed distribution every method samples from."""

from dataclasses import dataclass

import torch

from parallel_decoding.common.errors import require

PENALTY_RULES = ("vllm", "sglang")


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy; top_k 0 means no top-k cut. The penalties, `logit_bias` ((token, bias) pairs),
    `allowed_token_ids` (empty: all) and `min_tokens` (the `stop_token_ids` never chosen for the first
    `min_tokens` output tokens) adjust each row's logits before either (`common.penalties`), by the definitions of
    the engine serving the request (`penalty_rules`: "vllm" or "sglang"), so a lossless method equals its AR."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    penalty_rules: str = "vllm"

    def __post_init__(self) -> None:
        require(self.temperature >= 0, "temperature", ">= 0", self.temperature)
        require(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        require(self.top_k >= 0, "top_k", ">= 0", self.top_k)
        require(self.repetition_penalty > 0, "repetition_penalty", "> 0", self.repetition_penalty)
        require(self.min_tokens >= 0, "min_tokens", ">= 0", self.min_tokens)
        require(self.penalty_rules in PENALTY_RULES, "penalty_rules", f"one of {PENALTY_RULES}", self.penalty_rules)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts_logits(self) -> bool:
        """Whether a penalty, bias, allowed-token list or minimum length changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias or self.allowed_token_ids or (self.min_tokens and self.stop_token_ids))

    def generator(self) -> torch.Generator:
        """A CPU generator seeded from `seed` (fresh entropy when None)."""
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def without_token(logits: torch.Tensor, token_id: int) -> torch.Tensor:
    """A float copy of `logits` in which `token_id` can never be chosen (drafts never propose the mask)."""
    logits = logits.float().clone()
    logits[:, token_id] = float("-inf")
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of `logits` turned into the distribution decoding samples from (temperature, top-k, top-p)."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k:
        kth = logits.topk(min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs`."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Argmax per row when greedy, else a sample from the processed distribution."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(target_probs(logits, params), generator)
