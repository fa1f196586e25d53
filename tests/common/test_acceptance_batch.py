"""The batched greedy acceptance (SGLang's verifying modes; `accept_greedy` is its batch of one) equals the rule
request by request: the drafts up to the first mismatch with the argmax, then the argmax there."""

import torch

from parallel_decoding.common.acceptance import accept_greedy, accept_greedy_batch, leading_matches


def test_batched_greedy_acceptance_equals_per_request():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        requests = int(torch.randint(1, 6, (1,), generator=generator))
        width = int(torch.randint(1, 9, (1,), generator=generator))
        predicted = torch.randint(0, 3, (requests, width), generator=generator)  # 3 tokens: long runs match
        drafts = []
        for row in range(requests):
            n = int(torch.randint(0, width, (1,), generator=generator))
            tokens = predicted[row, :n].clone()
            flips = torch.rand(n, generator=generator) < 0.3
            tokens[flips] = (tokens[flips] + 1) % 3
            drafts.append(tokens.tolist())
        expected = []
        for row, d in enumerate(drafts):
            k = leading_matches(torch.tensor(d, dtype=torch.long), predicted[row])
            expected.append(d[:k] + [int(predicted[row, k])])
        assert accept_greedy_batch(drafts, predicted) == expected
        assert [accept_greedy(d, predicted[row]) for row, d in enumerate(drafts)] == expected


def test_batched_greedy_acceptance_without_drafts():
    predicted = torch.tensor([[4, 9], [7, 1]])
    assert accept_greedy_batch([[], []], predicted) == [[4], [7]]
    assert accept_greedy_batch([[4], [2]], predicted) == [[4, 9], [7]]
