"""The 4-D additive attention mask a transformers model needs for one planned forward."""

import torch

from parallel_decoding.common.window import Forward


def additive_mask(forward: Forward, prefix_len: int, dtype: torch.dtype, recompute: bool = False) -> torch.Tensor:
    """[1, 1, q, prefix_len + n]: 0 where a row may attend, the dtype's minimum elsewhere.

    With `recompute` the prefix rows are forwarded too (causal among themselves, q = prefix_len + n);
    otherwise only the window rows are queries and the cached prefix is fully visible.
    """
    n = forward.num_tokens
    visible = torch.zeros(prefix_len + n, prefix_len + n, dtype=torch.bool)
    visible[:prefix_len, :prefix_len] = torch.ones(prefix_len, prefix_len, dtype=torch.bool).tril()
    visible[prefix_len:, :prefix_len] = True
    visible[prefix_len:, prefix_len:] = forward.visibility()
    if not recompute:
        visible = visible[prefix_len:]
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None]
