"""WeDLM's and Nemotron-Labs-Diffusion's checkpoint configs as transformers classes, so that both engines load the
checkpoints without their remote code. Registering them is additive: transformers knows neither model_type.

WeDLM (`WeDLMForCausalLM`, model_type `wedlm`) keeps Qwen weights unchanged: Qwen2.5-shaped with qkv bias (WeDLM-7B)
or Qwen3-shaped with q/k norm (WeDLM-8B). NLD (`NemotronLabsDiffusionModel`, model_type `nemotron_labs_diffusion`)
is Ministral3 under other weight names (`common.checkpoint.NLD_WEIGHT_NAMES`).
"""

from typing import Any

from transformers import AutoConfig, Ministral3Config, Qwen3Config
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from common.checkpoint import NLD_MODEL_TYPE

# The architectures these checkpoints name, which the engine adapters map onto stock model classes.
ARCHITECTURES = ("WeDLMForCausalLM", "NemotronLabsDiffusionModel")


class WeDLMCheckpointConfig(Qwen3Config):
    """WeDLM's config fields (Qwen3's, plus `attention_bias` for the Qwen2.5 shape) under its own model_type."""

    model_type = "wedlm"


class NemotronLabsDiffusionConfig(Ministral3Config):
    """NLD's config fields (Ministral3's, plus `mask_token_id`, `block_size`, `dlm_type`) under its own model_type."""

    model_type = NLD_MODEL_TYPE

    @property
    def llama_4_scaling(self) -> dict[str, Any] | None:
        """The query scaling as vLLM's Mistral attention reads it, from where Ministral3 keeps it
        (`rope_parameters`, which SGLang's Ministral3 reads directly)."""
        rope = self.rope_parameters or {}
        if rope.get("llama_4_scaling_beta") is None:
            return None
        return {"beta": rope["llama_4_scaling_beta"],
                "original_max_position_embeddings": rope["original_max_position_embeddings"]}


def register_configs() -> None:
    """Register both configs with transformers' AutoConfig; idempotent."""
    for config in (WeDLMCheckpointConfig, NemotronLabsDiffusionConfig):
        if config.model_type not in CONFIG_MAPPING:
            AutoConfig.register(config.model_type, config)
