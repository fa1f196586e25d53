"""An extra forward of the target model on vLLM's paged KV cache, for windows that `common/` plans.

Each window sits physically right after its request's `cache_len` cached tokens (its KV goes into those
slots, which the next verify overwrites) and carries its own logical positions for RoPE. Attention is
causal or bidirectional among the window's rows, the cached prefix always visible.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parallel_decoding.common.row_stats import member_rows
from parallel_decoding.common.window import Attention, Forward


@dataclass(frozen=True)
class PagedWindow:
    """One request's window: its row in the runner's batch and how many of its tokens are cached before it."""

    row: int
    cache_len: int
    forward: Forward


def window_slots(runner: Any, rows: torch.Tensor, cache_lens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """KV slots of windows of `lengths` rows in batch `rows`, each right after its request's `cache_lens` cached
    tokens, which must lie in the KV blocks the request owns. Looked up on the host copy of the block table (vLLM
    writes it there and copies it to the device as it prepares the step): a few array operations and one copy of
    the slots to the device, not a dozen small tensor operations on the device copy (0.1 ms a call on CPU)."""
    if len(runner.kv_cache_config.kv_cache_groups) != 1:
        raise ValueError("parallel-decoding drafts support models with one KV cache group")
    table = runner.input_batch.block_table[0]
    batch_rows, lens = rows.numpy(), lengths.numpy().astype(np.int64)
    firsts = cache_lens.numpy().astype(np.int64)
    if bool(((firsts + lens) > table.num_blocks_per_row[batch_rows] * table.block_size).any()):
        raise RuntimeError("a window runs past the KV blocks its request owns: the scheduler reserved too few slots")
    physical = member_rows(firsts, lens)[0].numpy()
    blocks = table.get_numpy_array()[np.repeat(batch_rows, lens), physical // table.block_size].astype(np.int64)
    return torch.from_numpy(blocks * table.block_size + physical % table.block_size).to(runner.device)


def paged_metadata(runner: Any, rows: torch.Tensor, cache_lens: torch.Tensor, lengths: torch.Tensor,
                   positions: torch.Tensor, causal: bool, slot_mapping: torch.Tensor | None = None,
                   ) -> tuple[dict[str, Any], torch.Tensor]:
    """Attention metadata (per layer name) and KV slots (`window_slots`, unless the caller looked them up already)
    for windows at logical `positions` (flat): the metadata vLLM's own backend reads, built by the runner's
    builders."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = runner.device
    if slot_mapping is None:
        slot_mapping = window_slots(runner, rows, cache_lens, lengths)
    seq_lens = cache_lens + lengths
    query_start_loc = torch.zeros(len(rows) + 1, dtype=torch.int32)
    query_start_loc[1:] = lengths.cumsum(0)
    block_table = runner.input_batch.block_table[0].get_device_tensor(runner.input_batch.num_reqs)
    metadata = CommonAttentionMetadata(
        query_start_loc=query_start_loc.to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens.to(device),
        seq_lens_cpu_upper_bound=seq_lens,
        num_reqs=len(rows),
        num_actual_tokens=int(query_start_loc[-1]),
        max_query_len=int(lengths.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=block_table[rows.to(device)],
        slot_mapping=slot_mapping,
        causal=causal,
        is_prefilling=torch.zeros(len(rows), dtype=torch.bool),
        positions=positions.to(device),
    )
    per_layer: dict[str, Any] = {}
    for group in runner.attn_groups[0]:
        group_metadata = group.build_metadata(metadata)
        per_layer.update(dict.fromkeys(group.layer_names, group_metadata))
    return per_layer, slot_mapping


@torch.inference_mode()
def run_windows(runner: Any, windows: list[PagedWindow]) -> torch.Tensor:
    """Forward all windows in one batch; the logits of every window's `logit_rows`, concatenated in order."""
    from vllm.forward_context import set_forward_context

    attentions = {w.forward.attention for w in windows}
    if len(attentions) != 1 or Attention.CUSTOM in attentions:
        raise ValueError(f"one batch of windows needs one causal or bidirectional pattern, got {attentions}")
    lengths = torch.tensor([w.forward.num_tokens for w in windows], dtype=torch.int32)
    positions = torch.cat([w.forward.positions for w in windows])
    per_layer, slot_mapping = paged_metadata(
        runner, torch.tensor([w.row for w in windows], dtype=torch.long),
        torch.tensor([w.cache_len for w in windows], dtype=torch.int32), lengths, positions,
        Attention.CAUSAL in attentions)
    device = runner.device
    num_tokens = int(lengths.sum())
    slots = dict.fromkeys(runner.kv_cache_config.kv_cache_groups[0].layer_names, slot_mapping)
    token_ids = torch.cat([w.forward.token_ids for w in windows]).to(device)
    with set_forward_context(per_layer, runner.vllm_config, num_tokens=num_tokens, slot_mapping=slots):
        hidden = runner.model(input_ids=token_ids, positions=positions.to(device))
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1].long()])
    logit_index = torch.cat([start + w.forward.logit_rows for start, w in zip(starts, windows, strict=True)])
    return runner.model.compute_logits(hidden[logit_index.to(device)])
