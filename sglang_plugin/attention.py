"""A CPU attention backend for SGLang that also runs verify windows: SGLang's `torch_native` backend for prefill
and decode, plus `TARGET_VERIFY` forwards with the per-request mask our windows carry (`spec_info.custom_mask`,
laid out as SGLang's own verify inputs lay it out: rows x (prefix + rows) per request, flattened)."""

from typing import Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from torch.nn.functional import scaled_dot_product_attention

NAME = "pd_torch_sdpa"


class WindowSDPABackend(TorchNativeAttnBackend):
    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, forward_batch: Any,
                       save_kv_cache: bool = True) -> torch.Tensor:
        if not forward_batch.forward_mode.is_target_verify():
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        spec = forward_batch.spec_info
        width = spec.num_tokens_per_req
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
        heads, dim = layer.tp_q_head_num, layer.qk_head_dim
        queries = q.view(-1, heads, dim)
        out = q.new_empty(queries.shape[0], heads, layer.v_head_dim)
        keys = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        values = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        table = self.req_to_token_pool.req_to_token
        offset = 0
        for i, (row, prefix) in enumerate(zip(forward_batch.req_pool_indices.tolist(),
                                              forward_batch.seq_lens.tolist(), strict=True)):
            rows = slice(i * width, (i + 1) * width)
            locations = torch.cat([table[row, :prefix].long(), forward_batch.out_cache_loc[rows].long()])
            visible = spec.custom_mask[offset : offset + width * (prefix + width)].view(width, prefix + width)
            offset += width * (prefix + width)
            attended = scaled_dot_product_attention(
                queries[rows].movedim(0, 1)[None], keys[locations].movedim(0, 1)[None].to(q.dtype),
                values[locations].movedim(0, 1)[None].to(q.dtype), attn_mask=visible.bool(), scale=layer.scaling,
                enable_gqa=heads != layer.tp_k_head_num)
            out[rows] = attended[0].movedim(1, 0)
        return out.view(-1, heads * layer.v_head_dim)


def register() -> None:
    """Make the backend selectable (`--attention-backend pd_torch_sdpa`); idempotent."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if NAME not in ATTENTION_BACKEND_CHOICES:
        ATTENTION_BACKEND_CHOICES.append(NAME)
    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(WindowSDPABackend)
