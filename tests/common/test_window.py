"""`common.window.after_rows`: a forward preceded by causal rows the engine's cache lacks sees all of them, whatever
its own attention, and its logit rows move past them; a causal forward stays causal (no mask built)."""

import pytest
import torch

from parallel_decoding.common.diffusion_self import DiffusionSelfConfig, draft_window
from parallel_decoding.common.window import Attention, Forward, after_rows, causal_forward, rectangular


def blocks(n: int, inner: torch.Tensor) -> torch.Tensor:
    """The visibility after_rows must give: causal prepended rows, then the forward seeing all of them."""
    m = inner.shape[0]
    mask = torch.zeros(n + m, n + m, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    mask[n:, :n] = True
    mask[n:, n:] = inner
    return mask


CUSTOM = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)


@pytest.mark.parametrize("forward", [
    causal_forward([7, 8, 9], 5, [1, 2]),
    Forward(torch.tensor([7, 8, 9]), torch.tensor([5, 6, 6]), torch.tensor([0, 2]), Attention.CUSTOM, CUSTOM),
    Forward(torch.tensor([7, 8, 9]), torch.tensor([5, 6, 7]), torch.tensor([0, 1, 2]), Attention.BIDIRECTIONAL),
])
@pytest.mark.parametrize("prepended", [[], [3], [3, 4]])
def test_after_rows_prepends_causal_rows(forward, prepended):
    n = len(prepended)
    got = after_rows(forward, prepended, 5 - n)
    assert torch.equal(got.visibility(), blocks(n, forward.visibility()))
    assert got.token_ids.tolist() == prepended + forward.token_ids.tolist()
    assert got.positions.tolist() == list(range(5 - n, 5)) + forward.positions.tolist()
    assert torch.equal(got.logit_rows, forward.logit_rows + n)
    assert (got.attention is Attention.CAUSAL) == (forward.attention is Attention.CAUSAL)


def test_after_rows_alone():
    got = after_rows(None, [3, 4], 2)
    assert got.attention is Attention.CAUSAL and got.positions.tolist() == [2, 3] and got.logit_rows.numel() == 0


def test_rectangular_batch_of_draft_windows():
    """Two requests' `[seed, mask x w]` draft windows (w = 2 and 0) in one batch: padded with the mask, each
    bidirectional within its own window and causal past it."""
    config = DiffusionSelfConfig(num_speculative_tokens=2, mask_token_id=9)
    tokens, visible = rectangular([draft_window(5, 10, 2, config), draft_window(6, 3, 0, config)], pad_token=9)
    assert tokens.tolist() == [[5, 9, 9], [6, 9, 9]]
    assert visible.int().tolist() == [[[1, 1, 1], [1, 1, 1], [1, 1, 1]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]]]
