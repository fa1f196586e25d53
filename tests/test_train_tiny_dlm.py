"""The demo's training batches put each objective's noisy block where the decoders will read it."""

import torch

from scripts.train_tiny_dlm import BLOCK, block_batch

MASK, START = 99, 10


def batch(objective: str):
    x = torch.arange(4 * 40).reshape(4, 40) % 90
    return x, block_batch(x, START, MASK, objective, torch.Generator().manual_seed(0))


def test_nld_block_is_bidirectional_and_predicts_own_slot():
    x, (ids, positions, visible, rows, masked, targets) = batch("nld")
    assert torch.equal(ids[:, :START], x[:, :START]) and torch.equal(positions[0], torch.arange(START + BLOCK))
    assert visible[START:, START:].all() and not visible[:START, START:].any()
    assert torch.equal(visible[:START, :START], torch.ones(START, START, dtype=torch.bool).tril())
    block = ids[:, START : START + BLOCK]
    assert torch.equal(block[:, 0], x[:, START])  # the seed is never masked
    assert torch.equal(block[:, 1:] == MASK, masked)
    assert torch.equal(rows, torch.arange(START + 1, START + BLOCK))  # row j predicts slot j (llada)
    assert torch.equal(targets, x[:, START + 1 : START + BLOCK])


def test_wedlm_block_is_reordered_causal_and_unshifted():
    x, (ids, positions, visible, rows, masked, targets) = batch("wedlm")
    assert torch.equal(visible, torch.ones(START + BLOCK, START + BLOCK, dtype=torch.bool).tril())
    assert torch.equal(rows, torch.arange(START, START + BLOCK))
    for b in range(x.shape[0]):
        slots = positions[b, START:]
        assert sorted(slots.tolist()) == list(range(START, START + BLOCK))
        assert masked[b].long().diff().ge(0).all()  # filled slots first, masks after
        block = ids[b, START:]
        assert torch.equal(block[masked[b]], torch.full((int(masked[b].sum()),), MASK))
        assert torch.equal(block[~masked[b]], x[b, slots[~masked[b]]])
        assert torch.equal(targets[b], x[b, slots])  # a mask row predicts its own slot
