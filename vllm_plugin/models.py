"""Checkpoint architectures vLLM does not know whose weights a stock vLLM class already reads (imported lazily)."""

from typing import Any

from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from common.checkpoint import stock_model_type


class WeDLMForCausalLM(Qwen3ForCausalLM):
    """A WeDLM checkpoint as vLLM's Qwen3 model, or as its Qwen2 model for the qkv-bias (Qwen2.5) shape."""

    def __new__(cls, *, vllm_config: Any, prefix: str = "") -> Any:
        if stock_model_type(vllm_config.model_config.hf_config.to_dict()) == "qwen2":
            return Qwen2ForCausalLM(vllm_config=vllm_config, prefix=prefix)
        return super().__new__(cls)
