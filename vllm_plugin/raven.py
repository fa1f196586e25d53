"""Huginn's `RavenForCausalLM` as a vLLM model: `common/`'s model with its attention on vLLM's paged KV cache.

One vLLM attention layer per model layer, the core's shared by all recurrences (upstream's `compress-s4`), so the
cache costs what an 8-layer model's costs. Forwards run the rows the `huginn` proposer stages
(`common.huginn.forward.StagedRaven`).
"""

from typing import Any

import torch
from torch import nn

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.forward import StagedRaven
from parallel_decoding.common.models.raven import LayerCache, RavenConfig


class RavenForCausalLM(StagedRaven):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        from vllm.model_executor.layers.attention import Attention

        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ConfigError("RavenForCausalLM runs with tensor_parallel_size 1 only, got "
                              f"{vllm_config.parallel_config.tensor_parallel_size}")
        config = RavenConfig.from_dict(vllm_config.model_config.hf_config.to_dict())
        super().__init__(config)
        n_layers = config.n_layers_in_prelude + config.n_layers_in_recurrent_block + config.n_layers_in_coda
        self.attn = nn.ModuleList(
            Attention(config.n_heads, config.head_dim, config.head_dim**-0.5, config.n_heads,
                      cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn.{i}" if prefix else f"attn.{i}")
            for i in range(n_layers)
        )
        self.paged = LayerCache(self.attn)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.transformer["wte"](input_ids) * self.config.emb_scale

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: Any = None, **kwargs: Any) -> torch.Tensor:
        if inputs_embeds is not None:
            raise ConfigError("RavenForCausalLM takes token ids, not prompt embeddings")
        return self.run_staged(self.paged, input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

