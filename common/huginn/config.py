"""Huginn's settings under upstream `generate()`'s keyword names, checked per sampler, and what the engines serve."""

from dataclasses import dataclass, fields

from parallel_decoding.common.errors import ConfigError, require

SAMPLERS = ("ar", "adaptive", "speculative", "wavefront")
SAMPLER_FIELDS = {
    "ar": {"cache_lookup_strategy"},
    "adaptive": {"criterion", "exit_threshold"},
    "speculative": {"draft_steps", "lookahead_for_draft", "cache_lookup_strategy"},
    "wavefront": {"inner_recurrence", "exit_t", "freeze_strategy", "ema_embeds", "state_noise_mixing",
                  "max_wavefront", "headway", "dampened_state_mixer", "sqrt_mixer", "continuous_compute",
                  "max_diffusion_steps", "full_prefill", "return_analysis_tablets", "return_full_state_tablet",
                  "frozen_token", "cache_lookup_strategy"},
}
FREEZE_STRATEGIES = ("latent-diff", "fixed", "token-stability")
REFUSED_FREEZE_STRATEGIES = ("latent-acceleration-1", "latent-acceleration-2")
COMMON_FIELDS = {"sampler", "num_steps", "init_scale"}
LATENT_SEED_STRIDE = 1_000_003
GREEDY_LATENT_SEED = 0  # the latent (and state-noise) seed of a greedy request without one: temperature 0 reproduces


@dataclass(frozen=True)
class HuginnConfig:
    """A sampler and its settings; a setting of another sampler is refused by name."""

    sampler: str = "ar"
    num_steps: int = 32
    init_scale: float = 1.0
    cache_lookup_strategy: str = "compress-s4"
    criterion: str = "latent-diff"
    exit_threshold: float = 0.03
    draft_steps: int = 4
    lookahead_for_draft: int = 8
    inner_recurrence: int = 4
    exit_t: float = 0.03
    freeze_strategy: str = "latent-diff"
    ema_embeds: float = 0.1
    state_noise_mixing: float = 0.5
    max_wavefront: int = 128
    headway: int = 1
    dampened_state_mixer: bool = True
    sqrt_mixer: bool = False
    continuous_compute: bool = False
    max_diffusion_steps: int = 4096
    full_prefill: bool = True
    return_analysis_tablets: bool = False
    return_full_state_tablet: bool = False
    frozen_token: str = "input"

    def __post_init__(self) -> None:
        require(self.sampler in SAMPLERS, "sampler", f"one of {SAMPLERS}", self.sampler)
        for f in fields(self):
            unused = f.name not in COMMON_FIELDS | SAMPLER_FIELDS[self.sampler]
            if unused and getattr(self, f.name) != f.default:
                raise ConfigError(f"{f.name} does not apply to the {self.sampler!r} sampler")
        require(isinstance(self.num_steps, int) and self.num_steps >= 1, "num_steps", "a positive integer",
                self.num_steps)
        require(self.cache_lookup_strategy in ("compress-s4", "full"), "cache_lookup_strategy",
                "'compress-s4' or 'full'", self.cache_lookup_strategy)
        require(self.criterion == "latent-diff", "criterion", "'latent-diff'", self.criterion)
        require(self.exit_threshold >= 0 and self.exit_t >= 0, "exit_threshold", ">= 0",
                min(self.exit_threshold, self.exit_t))
        if self.sampler == "speculative":
            require(1 <= self.draft_steps < self.num_steps, "draft_steps", "in [1, num_steps)", self.draft_steps)
        require(self.lookahead_for_draft >= 1, "lookahead_for_draft", ">= 1", self.lookahead_for_draft)
        if self.sampler == "wavefront":
            require(1 <= self.inner_recurrence <= self.num_steps, "inner_recurrence", "in [1, num_steps]",
                    self.inner_recurrence)
        if self.freeze_strategy in REFUSED_FREEZE_STRATEGIES:
            raise ConfigError(f"freeze_strategy {self.freeze_strategy!r} is not served (one of {FREEZE_STRATEGIES})")
        require(self.freeze_strategy in FREEZE_STRATEGIES, "freeze_strategy", f"one of {FREEZE_STRATEGIES}",
                self.freeze_strategy)
        require(0 <= self.ema_embeds < 1, "ema_embeds", "in [0, 1)", self.ema_embeds)
        require(0 <= self.state_noise_mixing <= 1, "state_noise_mixing", "in [0, 1]", self.state_noise_mixing)
        least = 2 if self.frozen_token == "input" and self.freeze_strategy != "fixed" else 1
        require(self.max_wavefront >= least or self.max_wavefront == 0, "max_wavefront",
                f">= {least} (a wave of one whose first row is frozen never commits), or 0 for no bound",
                self.max_wavefront)
        require(self.headway == 1, "headway", "1 (one new position per step)", self.headway)
        require(self.max_diffusion_steps >= 1, "max_diffusion_steps", ">= 1", self.max_diffusion_steps)
        require(self.full_prefill is True, "full_prefill", "true (the engines prefill the prompt)", self.full_prefill)
        for name in ("return_analysis_tablets", "return_full_state_tablet"):
            require(getattr(self, name) is False, name, "false (no analysis tablets are served)", getattr(self, name))
        require(self.frozen_token in ("input", "prediction"), "frozen_token", "'input' or 'prediction'",
                self.frozen_token)


ENGINE_SAMPLERS = ("ar", "adaptive", "wavefront")


def check_engine_config(config: HuginnConfig, engine: str) -> None:
    """What the engines serve: their samplers (the speculative sampler's drafts run at positions an engine has not
    scheduled) and one KV slot per core layer."""
    if config.sampler not in ENGINE_SAMPLERS:
        raise ConfigError(f"sampler must be one of {list(ENGINE_SAMPLERS)} on {engine}, got {config.sampler!r} (the "
                          f"speculative sampler's drafts run at positions {engine} has not scheduled)")
    if config.sampler == "wavefront" and config.max_wavefront == 0:
        raise ConfigError(f"max_wavefront must be >= 1 on {engine} (its rows are the step's draft slots), got 0")
    if config.cache_lookup_strategy != "compress-s4":
        raise ConfigError(f"cache_lookup_strategy must be 'compress-s4' on {engine} (one KV slot per core layer), "
                          f"got {config.cache_lookup_strategy!r}")
