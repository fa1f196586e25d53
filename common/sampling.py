"""Per-request sampling parameters and the processed distribution every method samples from."""

from dataclasses import dataclass

import torch

from parallel_decoding.common.errors import require

RULES = ("vllm", "sglang")


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy; top_k 0 means no top-k cut, `min_p` 0 no min-p cut. The penalties, `logit_bias`
    ((token, bias) pairs), `allowed_token_ids` (empty: all) and `min_tokens` (the `stop_token_ids` never chosen for
    the first `min_tokens` output tokens) adjust each row's logits before either (`common.penalties`). Both follow
    the definitions of the engine serving the request (`rules`: "vllm" or "sglang"), so a lossless method equals
    that engine's AR, under sampling too."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    rules: str = "vllm"

    def __post_init__(self) -> None:
        require(self.temperature >= 0, "temperature", ">= 0", self.temperature)
        require(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        require(self.top_k >= 0, "top_k", ">= 0", self.top_k)
        require(0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        require(self.repetition_penalty > 0, "repetition_penalty", "> 0", self.repetition_penalty)
        require(self.min_tokens >= 0, "min_tokens", ">= 0", self.min_tokens)
        require(self.rules in RULES, "rules", f"one of {RULES}", self.rules)

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
    """Rows of `logits` turned into the distribution decoding samples from: temperature, then the top-k, top-p and
    min-p cuts as the request's engine makes them (min-p: the tokens less likely than `min_p` times the most likely
    one). vLLM's: min-p, then top-k, then top-p over the distribution renormalised after them. SGLang's: top-k by
    rank and top-p over the whole distribution's cumulative mass, then min-p."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.rules == "sglang":
        return sglang_filtered(logits.softmax(-1), params)
    if params.min_p:
        logits = min_p_cut(logits, params.min_p, 1.0)  # `logits` is this function's own copy here
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


def min_p_cut(logits: torch.Tensor, min_p: float, temperature: float) -> torch.Tensor:
    """`logits`, in place, with the tokens less likely than `min_p` times the most likely at `temperature` set to
    -inf: vLLM's min-p, made before a sampler that applies the temperature itself."""
    probs = (logits.float() / temperature).softmax(-1)
    return logits.masked_fill_(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))


def sglang_filtered(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """SGLang's cuts of `probs` (its sampler's): over the probabilities sorted once, ranks from `top_k` on, tokens
    whose mass before them exceeds `top_p`, then those below `min_p` times the most likely; renormalised."""
    if not (params.top_k or params.top_p < 1 or params.min_p):
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop = mass_before > params.top_p
    if params.top_k:
        drop |= torch.arange(probs.shape[-1], device=probs.device) >= params.top_k
    kept = sorted_probs.masked_fill(drop, 0.0)
    if params.min_p:
        kept = kept.masked_fill(kept < params.min_p * kept[..., :1], 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, kept)
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs`."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Argmax per row when greedy, else a sample from the processed distribution."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(target_probs(logits, params), generator)
