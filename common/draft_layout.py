"""Which logit row predicts a masked block slot: the checkpoint's `dlm_type`, the field NLD's own code reads.

`llada` (NLD's checkpoints and its code's default): a mask row predicts its own slot, so slot j is read on row j.
`dream`: logits stay shifted as in AR decoding, so slot j is read on row j-1.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from parallel_decoding.common.checkpoint import resolve_mask_token_id
from parallel_decoding.common.errors import ConfigError

DLM_TYPES = ("llada", "dream")
DEFAULT_DLM_TYPE = "llada"


def draft_rows(width: int, dlm_type: str | None) -> torch.Tensor:
    """Rows of a `[seed, slot 1 .. slot width]` block whose logits predict slots 1..width, in order."""
    first = 0 if dlm_type == "dream" else 1
    return torch.arange(first, first + width)


def resolve_dlm_type(config: Any, model_config: Any) -> Any:
    """The config with `dlm_type` set: its own value, else the model config's, else `llada`; others refused.

    Configs of methods without blocks of masks (no `dlm_type` field) come back unchanged.
    """
    if getattr(config, "dlm_type", DEFAULT_DLM_TYPE) is not None:
        return config
    value = getattr(model_config, "dlm_type", None) or DEFAULT_DLM_TYPE
    if value not in DLM_TYPES:
        raise ConfigError(f"the model config's dlm_type must be one of {list(DLM_TYPES)}, got {value!r}; "
                          'override it in the method config, e.g. {"dlm_type": "llada"}')
    return dataclasses.replace(config, dlm_type=value)


def complete_config(config: Any, model_config: Any, load_tokenizer: Callable[[], Any]) -> Any:
    """A method config with what the checkpoint decides filled in: the mask id (override, model config, else the
    tokenizer, loaded only then; never guessed) and `dlm_type`. Configs without those fields come back unchanged."""
    if hasattr(config, "mask_token_id"):
        tokenizer = None
        if config.mask_token_id is None and getattr(model_config, "mask_token_id", None) is None:
            tokenizer = load_tokenizer()
        mask_id = resolve_mask_token_id(model_config, tokenizer, config.mask_token_id)
        config = dataclasses.replace(config, mask_token_id=mask_id)
    return resolve_dlm_type(config, model_config)
