"""WeDLM and NLD architectures as SGLang's stock models: WeDLM as Qwen3 (or Qwen2 for the qkv-bias shape), NLD
as Ministral3 with its weight names mapped."""

from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.models.ministral3 import Ministral3ForCausalLM
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.qwen3 import Qwen3ForCausalLM

from parallel_decoding.common.checkpoint import stock_model_type, stock_weight_name


class WeDLMForCausalLM(Qwen3ForCausalLM):
    """A WeDLM checkpoint as SGLang's Qwen3 model, or as its Qwen2 model for the qkv-bias (Qwen2.5) shape."""

    def __new__(cls, config: Any, *args: Any, **kwargs: Any) -> Any:
        if stock_model_type(config.to_dict()) == "qwen2":
            return Qwen2ForCausalLM(config, *args, **kwargs)
        return super().__new__(cls)


class NemotronLabsDiffusionModel(Ministral3ForCausalLM):
    """An NLD checkpoint: `encoder.*` is the decoder, `diffusion_head` the LM head. The llama-4 query scaling
    counts positions in units of the original context, as transformers' Ministral3 does (SGLang's uses
    `max_position_embeddings`)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        original = (config.rope_parameters or {}).get("original_max_position_embeddings")
        if original is not None:
            for layer in self.model.layers:
                if hasattr(layer, "self_attn"):
                    layer.self_attn.max_position_embeddings = original

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        return super().load_weights((stock_weight_name(name), tensor) for name, tensor in weights)


EntryClass = [WeDLMForCausalLM, NemotronLabsDiffusionModel]
