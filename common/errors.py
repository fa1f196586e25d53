"""The one error type for bad user input, raised before any forward."""


class ConfigError(ValueError):
    """A user-supplied setting is invalid; the message names the field and what is allowed."""


def require(condition: bool, field: str, allowed: str, got: object) -> None:
    """Raise ConfigError naming `field` and the `allowed` values unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{field} must be {allowed}, got {got!r}")


def require_mask_token(mask_token_id: int | None) -> None:
    """Methods that decode masks refuse to start without a mask id (never guessed)."""
    require(mask_token_id is not None, "mask_token_id",
            "set: the model config, the tokenizer or the method config must define it", None)
