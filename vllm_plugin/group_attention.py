"""Quadratic self-speculation's structured mask on vLLM's own attention backend, inside the step's one forward.

The step's rows are `[seed, d_1 .. d_{m-1}]` (causal: the engine computes them as for any verify) and one group
`[chain token a, mask x k]` per chain token, which must see the cached prefix, the chain before `a`, and its own
group bidirectionally. After the backend's own pass over the whole step, each group's rows are attended again by
the same backend: its KV written for a moment right after the chain's first `a` tokens (groups from last to first,
so the chain before each is intact), its queries run bidirectionally over that prefix, the chain's KV put back
after. Every call is the backend's own (`do_kv_cache_update`, `forward`), with metadata from the runner's own
builders, so the KV layout of any backend is respected. On GPU the same passes run on FlashAttention; a backend
with arbitrary masks (FlexAttention's block mask, FlashInfer's custom mask) would run the step in one call.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from parallel_decoding.common.row_stats import member_rows
from parallel_decoding.vllm_plugin.paged_forward import paged_metadata, window_slots


@dataclass(frozen=True)
class GroupedWindow:
    """One request's quadratic forward in the step: its first row in the flat batch, its batch row, its cached
    tokens, chain length `m`, group size `k + 1` and the groups' logical positions (flat, group by group)."""

    start: int
    row: int
    cache_len: int
    chain: int
    group: int
    positions: torch.Tensor


@dataclass(frozen=True)
class GroupPass:
    """Group `a` of every window that has one: its rows in the flat batch (a slice where they are one run, a lone
    window's: views instead of copies), where its KV goes for the pass, and the backend's metadata (per layer name)
    for its bidirectional view."""

    tokens: torch.Tensor | slice
    slots: torch.Tensor
    metadata: dict[str, Any]


@dataclass(frozen=True)
class GroupedStep:
    passes: list[GroupPass]
    chain_tokens: torch.Tensor | slice
    chain_slots: torch.Tensor


_step: list[GroupedStep | None] = [None]


def plan_step(runner: Any, windows: list[GroupedWindow]) -> GroupedStep:
    """The passes a step's grouped windows need, last group first; each window has its own group size (the width
    planner caps each request's `k` on its own). Every pass's KV slots and the chain's come from one batched lookup;
    only the backend's metadata is built per pass."""
    device = runner.device
    rows = torch.tensor([w.row for w in windows])
    cache_lens = torch.tensor([w.cache_len for w in windows], dtype=torch.int32)
    chains = torch.tensor([w.chain for w in windows], dtype=torch.int32)
    sizes = torch.tensor([w.group for w in windows])
    groups_start = torch.tensor([w.start + w.chain for w in windows])  # each window's first group row
    positions = torch.cat([w.positions for w in windows])
    positions_start = (chains * sizes).cumsum(0) - chains * sizes  # each window's first group position
    depth = torch.arange(int(chains.max()) - 1, -1, -1)  # the passes' groups, last first
    live = chains[None, :] > depth[:, None]  # [pass, window]: the window has the pass's group
    pass_of, window_of = live.nonzero(as_tuple=True)  # pass after pass, windows in order within each
    group = depth[pass_of]  # each (pass, window) pair's group
    counts = live.sum(1).tolist()
    group_lens = sizes[window_of].int()  # each pair's rows
    rows_counts = torch.zeros(len(depth), dtype=torch.long).index_add_(0, pass_of, group_lens.long()).tolist()
    slots = window_slots(runner, torch.cat([rows[window_of], rows]), torch.cat([cache_lens[window_of] + group,
                         cache_lens]).int(), torch.cat([group_lens, chains]))
    offsets = group * group_lens
    tokens = member_rows(groups_start[window_of] + offsets, group_lens)[0]
    pair_positions = positions[member_rows(positions_start[window_of] + offsets, group_lens)[0]]
    passes = []
    for a, here, lens, pass_slots, pass_tokens, pass_positions in zip(
            depth.tolist(), window_of.split(counts), group_lens.split(counts), slots[: len(tokens)].split(rows_counts),
            tokens.split(rows_counts), pair_positions.split(rows_counts), strict=True):
        metadata, _ = paged_metadata(runner, rows[here], cache_lens[here] + a, lens, pass_positions, causal=False,
                                     slot_mapping=pass_slots)
        if len(here) == 1:
            first = int(pass_tokens[0])
            passes.append(GroupPass(slice(first, first + int(lens[0])), pass_slots, metadata))
        else:
            passes.append(GroupPass(pass_tokens.to(device), pass_slots, metadata))
    if len(windows) == 1:
        chain_tokens: torch.Tensor | slice = slice(windows[0].start, windows[0].start + windows[0].chain)
    else:
        chain_tokens = member_rows(torch.tensor([w.start for w in windows]), chains)[0].to(device)
    return GroupedStep(passes, chain_tokens, slots[len(tokens):])


@contextmanager
def grouped(step: GroupedStep | None) -> Iterator[None]:
    """Attention layers run `step`'s passes during the forward inside this block."""
    _step[0] = step
    try:
        yield
    finally:
        _step[0] = None


def install(model_layers: dict[str, Any]) -> None:
    """Wrap the backend `forward` of every attention layer (vLLM's static forward context), once the model is
    built; idempotent."""
    for layer in model_layers.values():
        impl = getattr(layer, "impl", None)
        if impl is None or not hasattr(impl, "do_kv_cache_update") or getattr(impl, "grouped", False):
            continue
        impl.forward = _with_groups(impl, impl.forward)
        impl.grouped = True


def _with_groups(impl: Any, forward: Any) -> Any:
    def forward_with_groups(layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor, *args: Any,
                            **kwargs: Any) -> torch.Tensor:
        forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        step = _step[0]
        if step is None or attn_metadata is None:
            return output
        for group in step.passes:
            rows = group.tokens
            group_key, group_value = key[rows], value[rows]
            impl.do_kv_cache_update(layer, group_key, group_value, kv_cache, group.slots)
            if isinstance(rows, slice):  # the backend writes the group's rows of `output` in place
                forward(layer, query[rows], group_key, group_value, kv_cache, group.metadata[layer.layer_name],
                        output[rows])
                continue
            attended = output.new_empty((rows.numel(), *output.shape[1:]))
            forward(layer, query[rows], group_key, group_value, kv_cache, group.metadata[layer.layer_name], attended)
            output[rows] = attended
        impl.do_kv_cache_update(layer, key[step.chain_tokens], value[step.chain_tokens], kv_cache, step.chain_slots)
        return output

    return forward_with_groups
