"""Every decoding method described once: its config class, decoder, widest step, commit rule and the checkpoints it
needs, read by the reference CLI, both engine adapters, the bench and the docs; config parsing with named-field errors.
"""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parallel_decoding.common.assd.decoding import AssdConfig
from parallel_decoding.common.decoder import AutoregressiveDecoder, Decoder, Limits
from parallel_decoding.common.diffusion import DiffusionConfig, DiffusionDecoder
from parallel_decoding.common.diffusion_self import DiffusionSelfConfig, DiffusionSelfDecoder
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.jacobi import JacobiConfig, JacobiDecoder
from parallel_decoding.common.models.raven import ARCHITECTURE as RAVEN_ARCHITECTURE
from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecConfig, QuadraticSelfSpecDecoder
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.wedlm import WeDLMConfig, WeDLMDecoder
from parallel_decoding.common.wedlm_spec import WeDLMSpecConfig, WeDLMSpecDecoder


@dataclasses.dataclass(frozen=True)
class ARConfig:
    """Plain autoregressive decoding has no settings."""


@dataclasses.dataclass(frozen=True)
class Method:
    """One method. `kind`: `step` (a `Decoder` over a causal LM's forwards), `recurrent` (Huginn's samplers on a
    recurrent-depth model) or `infill` (ASSD on an any-subset AR model). `drafts(config)`: the most tokens past the
    seed that one step forwards for a request (vLLM's `num_speculative_tokens`); `proposals(config)`: how many of
    them a step can commit past the seed (the width an n-gram peer gets); `width_rule`: the same in words, for
    errors. `commits`: the decoder's own rule picks the tokens rather than following a lossless verifier.
    `architectures`: the checkpoints it needs, which no other method serves (empty: any causal LM). `engines`:
    the engines that serve it under this name (each has glue for it there)."""

    name: str
    config: type
    kind: str = "step"
    decoder: type[Decoder] | None = None
    drafts: Callable[[Any], int] = lambda config: 0
    proposals: Callable[[Any], int] = lambda config: 0
    width_rule: str = ""
    commits: bool = False
    architectures: tuple[str, ...] = ()
    engines: tuple[str, ...] = ()


BOTH = ("vllm", "sglang")


def _huginn_drafts(config: HuginnConfig) -> int:
    return max(config.max_wavefront - 1, 1) if config.sampler == "wavefront" else 1


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", ARConfig, decoder=AutoregressiveDecoder),
    Method("jacobi", JacobiConfig, decoder=JacobiDecoder, drafts=lambda c: c.planned_width,
           proposals=lambda c: c.planned_width, width_rule="block_size * num_blocks", engines=BOTH),
    Method("diffusion_self", DiffusionSelfConfig, decoder=DiffusionSelfDecoder,
           drafts=lambda c: c.planned_width, proposals=lambda c: c.planned_width,
           width_rule="num_speculative_tokens (n; mode quadratic: (n + 1)(n + 3) - 1)", engines=BOTH),
    # a chain of up to k tokens, then a group of k + 1 rows per chain token (served as diffusion_self, mode quadratic)
    Method("diffusion_self_quadratic", QuadraticSelfSpecConfig, decoder=QuadraticSelfSpecDecoder,
           drafts=lambda c: c.block_size * (c.block_size + 2) - 1, proposals=lambda c: c.block_size - 1,
           width_rule="(block_size)(block_size + 2) - 1", commits=True),
    Method("diffusion", DiffusionConfig, decoder=DiffusionDecoder, drafts=lambda c: c.block_size - 1,
           proposals=lambda c: c.block_size - 1, width_rule="block_size", commits=True, engines=BOTH),
    # the committing run and a full window
    Method("wedlm", WeDLMConfig, decoder=WeDLMDecoder, drafts=lambda c: 2 * c.window, proposals=lambda c: c.window,
           width_rule="window (2 x window)", commits=True, engines=BOTH),
    # up to window - 1 drafts, then window mask slots
    Method("wedlm_spec", WeDLMSpecConfig, decoder=WeDLMSpecDecoder, drafts=lambda c: 2 * c.window - 1,
           proposals=lambda c: c.planned_width, width_rule="window (2 x window - 1)", engines=BOTH),
    Method("huginn", HuginnConfig, kind="recurrent", drafts=_huginn_drafts, proposals=_huginn_drafts,
           width_rule="max_wavefront", commits=True, architectures=(RAVEN_ARCHITECTURE,), engines=BOTH),
    Method("assd", AssdConfig, kind="infill"),
)}


def method_spec(method: str) -> Method:
    """The description of `method`, or a ConfigError naming the methods."""
    if method not in METHODS:
        raise ConfigError(f"method must be one of {sorted(METHODS)}, got {method!r}")
    return METHODS[method]


def served_by(engine: str) -> list[str]:
    """The method names `engine` (`vllm` or `sglang`) serves."""
    return [name for name, m in METHODS.items() if engine in m.engines]


def step_methods() -> list[str]:
    """The methods whose decoders run on a causal LM in the reference runner (`make_decoder`)."""
    return [name for name, m in METHODS.items() if m.kind == "step"]


def max_drafts(method: str, config: Any) -> int:
    """The most tokens past the seed one step of `method` (as `config` resolves it) forwards per request."""
    method, config = decoding_method(method, config)
    return METHODS[method].drafts(config)


def max_proposals(method: str, config: Any) -> int:
    """How many tokens past the seed one step of `method` can commit: the width an n-gram peer gets."""
    method, config = decoding_method(method, config)
    return METHODS[method].proposals(config)


def commits(method: str, config: Any) -> bool:
    """Whether the decoder `method` runs with `config` picks its tokens by its own rule (no lossless verifier)."""
    return METHODS[decoding_method(method, config)[0]].commits


def check_architecture(method: str, architectures: list[str], noun: str = "method") -> None:
    """Refuse a method on a checkpoint it was not built for: one whose architecture belongs to another method, or,
    for a method that needs its own architecture, any other checkpoint."""
    for other in METHODS.values():
        if other.architectures and (other.name == method) != bool(set(other.architectures) & set(architectures)):
            raise ConfigError(f"{noun} {other.name} serves {', '.join(other.architectures)} checkpoints, and they "
                              f"are served by {noun} {other.name} only; got {noun} {method!r} on {architectures}")


def parse_config(method: str, settings: dict[str, Any] | str | None = None, **defaults: Any) -> Any:
    """Build the method's typed config from JSON, a `.json` file path, or a dict; `defaults` fill unset fields."""
    return build_config(method_spec(method).config, method, settings, **defaults)


def build_config(config_cls: type, name: str, settings: dict[str, Any] | str | None = None, **defaults: Any) -> Any:
    """A typed config dataclass from JSON, a `.json` file path, or a dict; unknown fields refused by name."""
    if isinstance(settings, str) and settings.endswith(".json"):
        try:
            settings = Path(settings).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"config file cannot be read: {err}") from None
    if isinstance(settings, str):
        try:
            settings = json.loads(settings)
        except json.JSONDecodeError as err:
            raise ConfigError(f"config is not valid JSON: {err}") from None
    settings = dict(settings or {})
    if not isinstance(settings, dict):
        raise ConfigError(f"config must be a JSON object, got {settings!r}")
    allowed = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise ConfigError(f"{name} config has unknown field(s) {unknown}; allowed: {allowed}")
    for field, value in defaults.items():
        if field in allowed and settings.get(field) is None:
            settings[field] = value
    try:
        return config_cls(**settings)
    except (TypeError, ConfigError) as err:
        raise ConfigError(f"{name} config: {err}") from None


def decoding_method(method: str, config: Any) -> tuple[str, Any]:
    """The method and config whose decoder runs a request: `diffusion_self` in mode `quadratic` is
    `diffusion_self_quadratic` with `num_speculative_tokens` + 1 mask slots per group."""
    if method == "diffusion_self" and config.mode == "quadratic":
        return "diffusion_self_quadratic", QuadraticSelfSpecConfig(
            block_size=config.num_speculative_tokens + 1, mask_token_id=config.mask_token_id, dlm_type=config.dlm_type,
            draft_adapter=config.draft_adapter)
    return method, config


def make_decoder(method: str, config: Any, prompt: list[int], sampling: SamplingParams, limits: Limits) -> Decoder:
    """A fresh per-request decoder for `method`."""
    method, config = decoding_method(method, config)
    decoder_cls = METHODS[method].decoder
    if decoder_cls is None:
        raise ConfigError(f"method {method} runs its own model, not a step decoder")
    return decoder_cls(prompt, sampling, limits, config)
