"""The training objectives put each noisy block where the decoders read it, the Jacobi teacher's fixed point and the
self-distillation rows are greedy AR decoding, and training is deterministic given a seed."""

from dataclasses import dataclass

import pytest
import torch

from scripts import train
from scripts.make_tiny_models import build_model

MASK = 99
RECIPE = train.Recipe(block_size=4, seq_len=20, batch_size=3)


@dataclass
class Output:
    logits: torch.Tensor


class Recorder(torch.nn.Module):
    """Stands in for the model: keeps the forward's inputs, returns zero logits."""

    def forward(self, input_ids, position_ids, attention_mask):
        self.inputs = input_ids, position_ids, attention_mask
        return Output(torch.zeros(*input_ids.shape, 100, requires_grad=True))


@dataclass
class Loss:
    loss: torch.Tensor


class XLNetRecorder(torch.nn.Module):
    """Stands in for an XLNet: keeps the permutation mask and labels."""

    def forward(self, input_ids, perm_mask, target_mapping, labels, use_mems):
        self.perm_mask, self.labels = perm_mask, labels
        return Loss(torch.zeros((), requires_grad=True))


def run(loss_fn, **options):
    x = (torch.arange(RECIPE.batch_size * RECIPE.seq_len).reshape(RECIPE.batch_size, -1) * 7) % 90
    model = Recorder()
    loss_fn(model, x, MASK, RECIPE, torch.Generator().manual_seed(1), RECIPE.batch_size, **options)
    ids, positions, mask = model.inputs
    return x, ids, positions, mask[:, 0] == 0


def test_nld_two_stream_mask_and_blocks():
    x, ids, positions, visible = run(train.nld_loss)
    n = x.shape[1]
    assert torch.equal(ids[:, :n], x) and torch.equal(positions[:, n:], positions[:, :n])
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for b in range(x.shape[0]):
        assert torch.equal(visible[b, :n, :n], causal) and not visible[b, :n, n:].any()
        noisy = ids[b, n:]
        masked = noisy == MASK
        assert torch.equal(noisy[~masked], x[b][~masked])
        starts = visible[b, n:, :n].long().sum(1)  # each noisy row sees the clean prefix before its block
        assert starts.diff().ge(0).all() and len(set(starts.tolist())) >= n // RECIPE.block_size
        for i in range(n):
            block = (starts == starts[i]).nonzero().flatten()
            assert torch.equal(visible[b, n + i, n:].nonzero().flatten(), block)  # bidirectional in its block
            assert torch.equal(visible[b, n + i, :n], torch.arange(n) < starts[i])
            assert not masked[block[0]]  # a block's seed is never masked


def test_wedlm_noisy_blocks_are_reordered_and_causal():
    x, ids, positions, visible = run(train.wedlm_loss)
    n = x.shape[1]
    for b in range(x.shape[0]):
        slots, noisy = positions[b, n:], ids[b, n:]
        assert sorted(slots.tolist()) == list(range(n))
        starts = visible[b, n:, :n].long().sum(1)
        assert torch.equal(visible[b, n:, :n], torch.arange(n)[None] < starts[:, None])
        for start in starts.unique().tolist():
            rows = (starts == start).nonzero().flatten()
            block = slots[rows]
            assert sorted(block.tolist()) == list(range(start, start + len(rows)))  # a block at its positions
            masked = noisy[rows] == MASK
            assert masked.long().diff().ge(0).all()  # filled first, masks after
            assert torch.equal(noisy[rows][~masked], x[b, block[~masked]])
            seen = visible[b, n + rows][:, n + rows]
            assert torch.equal(seen, torch.ones(len(rows), len(rows), dtype=torch.bool).tril())  # causal in block
            assert not visible[b, n + rows][:, n:].sum() > seen.sum()  # nothing outside the block


def test_draft_blocks_mask_all_but_the_seed():
    x, ids, _, visible = run(train.nld_loss, drafts=True)
    n = x.shape[1]
    for b in range(x.shape[0]):
        starts = visible[b, n:, :n].long().sum(1)
        seeds = torch.cat([torch.tensor([True]), starts.diff() > 0])
        assert torch.equal(ids[b, n:] == MASK, ~seeds)  # every block a whole draft: [seed, mask ...]


def test_ar_loss_reads_the_corpus_rows_only():
    logits = torch.randn(3, 8, 50)
    x = torch.randint(0, 50, (3, 8))
    assert train.ar_loss(logits[:0], x[:0]) == 0
    one = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:])
    assert torch.allclose(train.ar_loss(logits[:1], x[:1]), one)


def test_mixed_batches_put_distilled_rows_last():
    recipe = train.Recipe(batch_size=8, seq_len=6)
    gen = torch.Generator().manual_seed(0)
    stream = train.batches(torch.arange(100, 200), recipe, gen)
    pool = torch.arange(60).reshape(10, 6)
    x, corpus_rows = train.mixed(stream, pool, 0.5, gen)
    assert corpus_rows == 4 and x.shape == (8, 6)
    assert x[:4].min() >= 100 and x[4:].max() < 60  # corpus windows first, pool rows after


def test_distilled_rows_are_the_teachers_greedy_continuations():
    model = build_model("qwen3", 100, MASK, 0, hidden_size=64)
    recipe = train.Recipe(seq_len=12, distill_rows=5)
    data = torch.randint(1, 90, (200,), generator=torch.Generator().manual_seed(0))
    rows = train.greedy_rows(model, data, recipe, torch.Generator().manual_seed(0), chunk=3)
    assert rows.shape == (5, 12)
    greedy = rows[:, :4]  # a third of the row is corpus text
    with torch.no_grad():
        for _ in range(8):
            greedy = torch.cat([greedy, model(input_ids=greedy).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(rows, greedy)
    windows = {tuple(data[i : i + 4].tolist()) for i in range(len(data) - 3)}
    assert all(tuple(r[:4].tolist()) in windows for r in rows)


def test_jacobi_teacher_fixed_point_is_greedy_ar():
    model = build_model("qwen3", 100, MASK, 0, hidden_size=64)
    prefix = torch.randint(1, 90, (2, 6), generator=torch.Generator().manual_seed(0))
    first, states, fixed = train.jacobi_trajectory(model, prefix, 5)
    greedy = prefix
    with torch.no_grad():
        for _ in range(6):
            greedy = torch.cat([greedy, model(input_ids=greedy).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(first, greedy[:, 6]) and torch.equal(fixed, greedy[:, 7:])
    assert torch.equal(states[0], first[:, None].expand(2, 5))  # drafts open as copies of the first token
    assert torch.equal(states[-1], fixed) and states.shape[0] <= 6


@pytest.mark.parametrize("objective,recipe", [
    ("ar", train.Recipe(steps=2, batch_size=2, seq_len=64, hidden_size=64, num_layers=1)),
    ("raven", train.Recipe(steps=2, batch_size=2, seq_len=32, hidden_size=32)),
    ("asarm", train.Recipe(steps=2, batch_size=2, seq_len=32, hidden_size=32, num_layers=1)),
])
def test_training_is_deterministic_given_a_seed(objective, recipe):
    first, _ = train.train(objective, recipe)
    second, _ = train.train(objective, recipe)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_raven_unrolling_is_poisson_lognormal_with_truncated_backprop():
    gen = torch.Generator().manual_seed(0)
    draws = [train.unrolling(16, 4, gen) for _ in range(2000)]
    totals = torch.tensor([a + b for a, b in draws], dtype=torch.float)
    assert 15 < totals.mean() < 18  # the Poisson-lognormal's mean is mean + 1 (upstream adds one)
    assert totals.std() > 4 and all(b == min(a + b, 4) for a, b in draws)


def test_asarm_orders_rank_given_positions_first_left_to_right():
    ranks, given = train.asarm_orders(64, 24, torch.Generator().manual_seed(0))
    shuffled = 0
    for row, kept in zip(ranks, given, strict=True):
        assert sorted(row.tolist()) == list(range(24))
        count = int(kept.sum())
        assert torch.equal(row[kept], torch.arange(count))  # given ones first, left to right
        holes = row[~kept]
        shuffled += bool(holes.diff().lt(0).any())  # holes after them, in order or shuffled
        assert holes.min() >= count if len(holes) else True
    assert 10 < shuffled < 54


def test_asarm_loss_learns_from_the_holes_only():
    model = XLNetRecorder()
    x = torch.arange(40).reshape(2, 20)
    train.asarm_loss(model, x, torch.Generator().manual_seed(3))
    visible = model.perm_mask == 0
    for b in range(2):
        given = model.labels[b] == -100
        assert torch.equal(model.labels[b][~given], x[b][~given])
        assert not visible[b].diagonal().any()  # the query stream never sees its own token
        assert not visible[b][given][:, ~given].any()  # given positions see no hole
        assert visible[b][given][:, given].sum() == given.sum() * (given.sum() - 1)  # and each other
