"""Plain-torch versions of the `sgl_kernel` CPU ops SGLang's CPU path calls, defined only where missing.

Semantics follow SGLang's reference (Triton/torch) implementations of the same ops. On a machine with SGLang's own
kernel build every op exists and nothing here is registered.
"""

import ctypes

import torch

SCHEMAS = {
    "assign_req_to_token_pool_cpu": "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
                                    "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
    "assign_extend_cache_locs_cpu": "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
                                    "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
    "copy_all_layer_kv_cache_cpu": "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
}
_library: list[torch.library.Library] = []


def _slots(req_pool_indices: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool row, slot) of every request's slots [start, end), request after request as the packed locations run: one
    batched gather instead of a slice a request (a step's requests each have one on SGLang's speculative path)."""
    lengths = (end - start).long()
    rows = req_pool_indices.long().repeat_interleave(lengths)
    packed = torch.arange(rows.numel())
    firsts = (start.long() - (lengths.cumsum(0) - lengths)).repeat_interleave(lengths)
    return rows, firsts + packed


def assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Write each request's new KV locations into its row of the request-to-token table."""
    rows, slots = _slots(req_pool_indices, start_offset, end_offset)
    req_to_token[rows, slots] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """Read each request's KV locations for slots [start, end) out of the request-to-token table."""
    rows, slots = _slots(req_pool_indices, start_offset, end_offset)
    out_cache_loc[: rows.numel()] = req_to_token[rows, slots].to(out_cache_loc.dtype)


def copy_all_layer_kv_cache(data_ptrs, strides, tgt_loc, src_loc):
    """Copy KV rows `src_loc` to `tgt_loc` in every layer buffer (given by address and row stride in bytes)."""
    if tgt_loc.numel() == 0:
        return
    src, tgt = src_loc.long(), tgt_loc.long()
    rows = int(torch.maximum(src.max(), tgt.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buffer = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        view = torch.frombuffer(buffer, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src].clone()


IMPLEMENTATIONS = {
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs,
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache,
}


def register_missing_ops() -> list[str]:
    """Define `sgl_kernel::<op>` for each op the installed kernels lack; idempotent. Returns the ops added."""
    added = []
    for name, schema in SCHEMAS.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        if not _library:
            _library.append(torch.library.Library("sgl_kernel", "FRAGMENT"))
        _library[0].define(name + schema)
        _library[0].impl(name, IMPLEMENTATIONS[name], "CPU")
        added.append(name)
    return added
