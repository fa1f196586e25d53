"""WeDLM's, Nemotron-Labs-Diffusion's and Huginn's checkpoint configs as transformers classes, so that both engines
load the checkpoints without their remote code. Registering them is additive: transformers knows none of these
model_types.

WeDLM (`WeDLMForCausalLM`, model_type `wedlm`) keeps Qwen weights unchanged: Qwen2.5-shaped with qkv bias (WeDLM-7B)
or Qwen3-shaped with q/k norm (WeDLM-8B). NLD (`NemotronLabsDiffusionModel`, model_type `nemotron_labs_diffusion`)
is Ministral3 under other weight names (`common.checkpoint.NLD_WEIGHT_NAMES`).
"""

from dataclasses import fields
from typing import Any, ClassVar

from transformers import AutoConfig, Ministral3Config, PretrainedConfig, Qwen3Config
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from parallel_decoding.common.checkpoint import NLD_MODEL_TYPE
from parallel_decoding.common.models.raven import ARCHITECTURE as RAVEN_ARCHITECTURE
from parallel_decoding.common.models.raven import MODEL_TYPE as RAVEN_MODEL_TYPE
from parallel_decoding.common.models.raven import RavenConfig

# The architectures these checkpoints name, which the engine adapters map onto stock model classes.
ARCHITECTURES = ("WeDLMForCausalLM", "NemotronLabsDiffusionModel", RAVEN_ARCHITECTURE)


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


class HuginnRavenConfig(PretrainedConfig):
    """Huginn's config fields (`common.models.raven.RavenConfig`'s, and any others kept as they are), with the
    standard names engines read (hidden size, heads, layers, context) mapped onto them."""

    model_type = RAVEN_MODEL_TYPE
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "n_embd", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
        "max_position_embeddings": "block_size"}

    def __init__(self, **kwargs: Any) -> None:
        defaults = RavenConfig()
        for f in fields(RavenConfig):
            setattr(self, f.name, kwargs.pop(f.name, getattr(defaults, f.name)))
        layers = self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda
        self.n_layers = kwargs.pop("n_layers", layers)
        kwargs.setdefault("tie_word_embeddings", self.tie_embeddings)
        super().__init__(**kwargs)


def register_configs() -> None:
    """Register the configs with transformers' AutoConfig; idempotent."""
    for config in (WeDLMCheckpointConfig, NemotronLabsDiffusionConfig, HuginnRavenConfig):
        if config.model_type not in CONFIG_MAPPING:
            AutoConfig.register(config.model_type, config)
