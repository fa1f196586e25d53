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
    """Group `a` of every window that has one: its rows in the flat batch, where its KV goes for the pass, and the
    backend's metadata (per layer name) for its bidirectional view."""

    tokens: torch.Tensor
    slots: torch.Tensor
    metadata: dict[str, Any]


@dataclass(frozen=True)
class GroupedStep:
    passes: list[GroupPass]
    chain_tokens: torch.Tensor
    chain_slots: torch.Tensor


_step: list[GroupedStep | None] = [None]


def plan_step(runner: Any, windows: list[GroupedWindow]) -> GroupedStep:
    """The passes a step's grouped windows need, last group first (one group size, the step's `k + 1`)."""
    device, size = runner.device, windows[0].group
    rows = torch.tensor([w.row for w in windows])
    cache_lens = torch.tensor([w.cache_len for w in windows], dtype=torch.int32)
    chains = torch.tensor([w.chain for w in windows], dtype=torch.int32)
    groups_start = torch.tensor([w.start + w.chain for w in windows])  # each window's first group row
    positions = torch.nn.utils.rnn.pad_sequence([w.positions.view(-1, size) for w in windows], batch_first=True)
    passes = []
    for a in reversed(range(int(chains.max()))):
        here = (chains > a).nonzero()[:, 0]
        lengths = torch.full((len(here),), size, dtype=torch.int32)
        metadata, slots = paged_metadata(runner, rows[here], cache_lens[here] + a, lengths,
                                         positions[here, a].flatten(), causal=False)
        tokens = (groups_start[here, None] + a * size + torch.arange(size)).flatten()
        passes.append(GroupPass(tokens.to(device), slots, metadata))
    starts = torch.tensor([w.start for w in windows])
    chain_slots = window_slots(runner, rows, cache_lens, chains)
    return GroupedStep(passes, member_rows(starts, chains)[0].to(device), chain_slots)


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
            impl.do_kv_cache_update(layer, key[group.tokens], value[group.tokens], kv_cache, group.slots)
            attended = output.new_empty((group.tokens.numel(), *output.shape[1:]))
            forward(layer, query[group.tokens], key[group.tokens], value[group.tokens], kv_cache,
                    group.metadata[layer.layer_name], attended)
            output[group.tokens] = attended
        impl.do_kv_cache_update(layer, key[step.chain_tokens], value[step.chain_tokens], kv_cache, step.chain_slots)
        return output

    return forward_with_groups
