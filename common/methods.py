"""Method names, their config classes and decoders, and config parsing with named-field errors."""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.decoder import AutoregressiveDecoder, Decoder, Limits
from common.diffusion import DiffusionConfig, DiffusionDecoder
from common.diffusion_self import DiffusionSelfConfig, DiffusionSelfDecoder
from common.errors import ConfigError
from common.huginn import HuginnConfig
from common.jacobi import JacobiConfig, JacobiDecoder
from common.quadratic_self_spec import QuadraticSelfSpecConfig, QuadraticSelfSpecDecoder
from common.sampling import SamplingParams
from common.wedlm import WeDLMConfig, WeDLMDecoder
from common.wedlm_spec import WeDLMSpecConfig, WeDLMSpecDecoder


@dataclasses.dataclass(frozen=True)
class ARConfig:
    """Plain autoregressive decoding has no settings."""


METHODS: dict[str, tuple[type, type[Decoder]]] = {
    "ar": (ARConfig, AutoregressiveDecoder),
    "jacobi": (JacobiConfig, JacobiDecoder),
    "diffusion_self": (DiffusionSelfConfig, DiffusionSelfDecoder),
    "diffusion_self_quadratic": (QuadraticSelfSpecConfig, QuadraticSelfSpecDecoder),
    "diffusion": (DiffusionConfig, DiffusionDecoder),
    "wedlm": (WeDLMConfig, WeDLMDecoder),
    "wedlm_spec": (WeDLMSpecConfig, WeDLMSpecDecoder),
}


# Methods the engines serve on their own model class, whose decoders are not `Decoder`s: their configs.
MODEL_METHODS: dict[str, type] = {"huginn": HuginnConfig}


def needs_mask_token(method: str) -> bool:
    return "mask_token_id" in config_fields(method)


def config_class(method: str) -> type:
    if method in MODEL_METHODS:
        return MODEL_METHODS[method]
    if method not in METHODS:
        raise ConfigError(f"method must be one of {sorted([*METHODS, *MODEL_METHODS])}, got {method!r}")
    return METHODS[method][0]


def config_fields(method: str) -> list[str]:
    return [f.name for f in dataclasses.fields(config_class(method))]


def parse_config(method: str, settings: dict[str, Any] | str | None = None, **defaults: Any) -> Any:
    """Build the method's typed config from JSON, a `.json` file path, or a dict; `defaults` fill unset fields."""
    return build_config(config_class(method), method, settings, **defaults)


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
    decoder_cls: Callable[..., Decoder] = METHODS[method][1]
    return decoder_cls(prompt, sampling, limits, config)
