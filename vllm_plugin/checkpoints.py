"""Make WeDLM checkpoints loadable without their remote code: `model_type: wedlm`, `WeDLMForCausalLM`.

WeDLM keeps Qwen weights unchanged: Qwen2.5-shaped with qkv bias (WeDLM-7B) or Qwen3-shaped with q/k norm
(WeDLM-8B). The registration is additive: vLLM knows neither name, so nothing it served before changes.
"""

from transformers import AutoConfig, Qwen3Config
from transformers.models.auto.configuration_auto import CONFIG_MAPPING


class WeDLMConfig(Qwen3Config):
    """WeDLM's config fields (Qwen3's, plus `attention_bias` for the Qwen2.5 shape) under its own model_type."""

    model_type = "wedlm"


def register() -> None:
    """Register the config with transformers and the architecture with vLLM (lazily imported); idempotent."""
    from vllm import ModelRegistry

    if "wedlm" not in CONFIG_MAPPING:
        AutoConfig.register("wedlm", WeDLMConfig)
    ModelRegistry.register_model("WeDLMForCausalLM", "vllm_plugin.models:WeDLMForCausalLM")
