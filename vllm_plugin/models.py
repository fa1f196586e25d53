"""Checkpoint architectures vLLM does not know whose weights a stock vLLM class already reads (imported lazily)."""

from collections.abc import Iterable
from typing import Any

import torch
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from parallel_decoding.common.checkpoint import stock_model_type, stock_weight_name


class WeDLMForCausalLM(Qwen3ForCausalLM):
    """A WeDLM checkpoint as vLLM's Qwen3 model, or as its Qwen2 model for the qkv-bias (Qwen2.5) shape."""

    def __new__(cls, *, vllm_config: Any, prefix: str = "") -> Any:
        if stock_model_type(vllm_config.model_config.hf_config.to_dict()) == "qwen2":
            return Qwen2ForCausalLM(vllm_config=vllm_config, prefix=prefix)
        return super().__new__(cls)


class NemotronLabsDiffusionForCausalLM(MistralForCausalLM):
    """An NLD checkpoint as vLLM's Mistral model (what it runs Ministral3 with): `encoder.*` is the decoder,
    `diffusion_head` the LM head; the llama-4 query scaling comes from the config (`checkpoints.py`)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights((stock_weight_name(name), tensor) for name, tensor in weights)
