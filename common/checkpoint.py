"""Loading a checkpoint for the reference runner and reading the ids decoding needs from it."""

import json
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from parallel_decoding.common.errors import ConfigError


def resolve_mask_token_id(model_config: Any, tokenizer: Any, override: int | None = None) -> int:
    """The mask id: the explicit override, else the model config's `mask_token_id`, else the tokenizer's.

    Never guessed: a checkpoint with none of the three is refused, naming the field to set.
    """
    vocab = getattr(model_config, "vocab_size", None)
    for source, value in (
        ("mask_token_id", override),
        ("the model config's mask_token_id", getattr(model_config, "mask_token_id", None)),
        ("the tokenizer's mask_token_id", getattr(tokenizer, "mask_token_id", None)),
    ):
        if value is None:
            continue
        if not isinstance(value, int) or value < 0 or (vocab is not None and value >= vocab):
            raise ConfigError(f"{source} must be a token id in [0, {vocab}), got {value!r}")
        return value
    raise ConfigError(
        "mask_token_id is required for this method: the model config and tokenizer define none; "
        'pass it in the method config, e.g. {"mask_token_id": 151665}'
    )


def eos_token_ids(model: PreTrainedModel, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids from the generation config, the model config and the tokenizer, deduplicated."""
    ids: list[int] = []
    sources = (getattr(model, "generation_config", None), model.config, tokenizer)
    for source in sources:
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for token in [value] if isinstance(value, int) else list(value or []):
            if token not in ids:
                ids.append(token)
    return tuple(ids)


NLD_MODEL_TYPE = "nemotron_labs_diffusion"
# NLD names its Ministral3 decoder `encoder` and its one (untied) output head `diffusion_head`.
NLD_WEIGHT_NAMES = {r"^encoder\.": "model.", r"^diffusion_head\.": "lm_head."}


def stock_weight_name(name: str) -> str:
    """An NLD weight name as the stock model names it (other names unchanged)."""
    for pattern, replacement in NLD_WEIGHT_NAMES.items():
        name = re.sub(pattern, replacement, name)
    return name


def stock_model_type(config: dict[str, Any]) -> str | None:
    """The stock transformers family whose weights a remote-code checkpoint shares, if we know one.

    WeDLM (`WeDLMForCausalLM`, model_type `wedlm`) keeps Qwen weights unchanged: Qwen2.5-shaped (qkv bias) for
    WeDLM-7B, Qwen3-shaped (q/k norm, no bias) for WeDLM-8B. NLD (`NemotronLabsDiffusionModel`) is Ministral3
    (YaRN, llama-4 query scaling) under other weight names (`NLD_WEIGHT_NAMES`).
    """
    if config.get("model_type") == "wedlm":
        return "qwen2" if config.get("attention_bias") or config.get("qkv_bias") else "qwen3"
    if config.get("model_type") == NLD_MODEL_TYPE:
        return "ministral3"
    return None


def load(
    model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, Any]:
    """A causal LM in eval mode (SDPA attention, which takes our 4-D masks) and its tokenizer.

    Checkpoints with a known stock equivalent load into the stock class unless `trust_remote_code` asks for the
    checkpoint's own code; everything else goes through `AutoModelForCausalLM`.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    raw = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    stock = None if trust_remote_code else stock_model_type(raw)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": "sdpa", "trust_remote_code": trust_remote_code}
    if stock is not None:
        fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
        kwargs["config"] = AutoConfig.for_model(stock, **fields)
        if raw.get("model_type") == NLD_MODEL_TYPE:
            kwargs["key_mapping"] = NLD_WEIGHT_NAMES
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    return model.to(device).eval(), tokenizer
