"""Huginn's `RavenForCausalLM` as an SGLang model: `common/`'s model with its attention on SGLang's paged KV pool.

One `RadixAttention` per model layer, the core's shared by all recurrences (upstream's `compress-s4`), so the pool
costs an 8-layer model's. Forwards run the rows the `huginn` worker stages (`common.huginn.forward.StagedRaven`).
"""

from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from torch import nn

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.forward import StagedRaven
from parallel_decoding.common.models.raven import LayerCache, RavenConfig


class RavenForCausalLM(StagedRaven):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        if quant_config is not None:
            raise ConfigError("RavenForCausalLM does not take a quantization config")
        raven = RavenConfig.from_dict(config.to_dict())
        super().__init__(raven)
        n_layers = raven.n_layers_in_prelude + raven.n_layers_in_recurrent_block + raven.n_layers_in_coda
        self.attn = nn.ModuleList(
            RadixAttention(raven.n_heads, raven.head_dim, raven.head_dim**-0.5, raven.n_heads, layer_id=i,
                           prefix=f"{prefix}.attn.{i}" if prefix else f"attn.{i}")
            for i in range(n_layers))
        self.logits_processor = LogitsProcessor(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                **kwargs: Any) -> Any:
        hidden = self.run_staged(LayerCache(self.attn, forward_batch), input_ids, positions)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)


EntryClass = [RavenForCausalLM]
