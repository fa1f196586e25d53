"""ASSD on a tiny random XLNet: the filled holes follow the model's joint in the decoding order exactly (enumeration
on a vocabulary of 8, three holes; a wrong resample rule fails the same test), greedy equals greedy sequential
decoding in the same order, model calls never exceed the tokens generated, and k <= 2 is refused saying why."""

import itertools

import pytest
import torch

from parallel_decoding.common.assd.decoding import (
    AssdConfig,
    bigram_drafts,
    conditionals,
    decoding_order,
    infill,
    perm_mask,
    with_holes,
)
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.sampling import SamplingParams, target_probs, without_token
from scripts.make_tiny_models import build_xlnet
from tests.support.exact import P_VALUE_FLOOR, chi_square_p_value, memo_conditionals

MASK = 7
HOLES = [1, MASK, MASK, MASK, 3]  # adjacent holes: their tokens depend on each other, p differs from q
SAMPLES = 2000
TEMPERATURE = 1.0


@pytest.fixture(scope="module")
def xlnet():
    return build_xlnet(8, MASK, seed=0)


def sequential_joint(model, tokens: list[int], sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """The exact distribution of the holes' tokens under sequential decoding left to right (given tokens first)."""
    sigma = decoding_order(tokens, MASK, "left_to_right", torch.Generator())
    given = sum(t != MASK for t in tokens)
    holes = sigma[given:]
    given_mask = torch.tensor([t != MASK for t in tokens])
    joint = {}
    for fill in itertools.product(range(MASK), repeat=len(holes)):
        ids, prob = list(tokens), 1.0
        ranks = torch.full((len(ids),), float(len(ids)))
        ranks[torch.tensor(sigma[:given], dtype=torch.long)] = torch.arange(given, dtype=torch.float)
        for j, (position, token) in enumerate(zip(holes, fill, strict=True)):
            logits = conditionals(model, ids, ranks, given_mask, [position])
            prob *= float(target_probs(without_token(logits, MASK), sampling)[0, token])
            ids[position], ranks[position] = token, given + j
        joint[fill] = prob
    return joint


def sampled_p_value(model, joint: dict, config: AssdConfig) -> float:
    """The chi-square p-value of SAMPLES seeded infills of HOLES against `joint` (each distinct model call run once)."""
    import parallel_decoding.common.assd.decoding as decoding

    counts: dict[tuple[int, ...], int] = {}
    holes = [i for i, t in enumerate(HOLES) if t == MASK]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding, "conditionals", memo_conditionals(decoding.conditionals))
        for seed in range(SAMPLES):
            result = infill(model, HOLES, MASK, config, SamplingParams(temperature=TEMPERATURE, seed=seed))
            assert result.nfe <= result.generated  # Theorem 1
            key = tuple(result.token_ids[i] for i in holes)
            counts[key] = counts.get(key, 0) + 1
    return chi_square_p_value(counts, joint)


def test_sampling_follows_the_sequential_joint(xlnet, monkeypatch):
    import parallel_decoding.common.assd.decoding

    torch.set_num_threads(1)
    joint = sequential_joint(xlnet, HOLES, SamplingParams(temperature=TEMPERATURE))
    assert sampled_p_value(xlnet, joint, AssdConfig(k=3)) > P_VALUE_FLOOR

    def resample_from_target(drafts, p, q, sampling, generator):  # a wrong rule: p instead of max(p - q, 0)
        for j, token in enumerate(drafts):
            if float(torch.rand(1, generator=generator)) * float(q[j, token]) >= float(p[j, token]):
                return drafts[:j], [int(torch.multinomial(p[j], 1, generator=generator))]
        return drafts, []

    monkeypatch.setattr(parallel_decoding.common.assd.decoding, "accept", resample_from_target)
    assert sampled_p_value(xlnet, joint, AssdConfig(k=3)) < P_VALUE_FLOOR


def test_ngram_drafts_follow_the_sequential_joint(xlnet):
    torch.set_num_threads(1)
    joint = sequential_joint(xlnet, HOLES, SamplingParams(temperature=TEMPERATURE))
    assert sampled_p_value(xlnet, joint, AssdConfig(k=3, drafter="ngram")) > P_VALUE_FLOOR


def test_bigram_drafts_chain_through_earlier_drafts():
    tokens = [1, 2, 1, MASK, MASK, 4, MASK]
    drafts, q = bigram_drafts(tokens, [3, 4, 6], MASK, 8, lambda row: int(row.argmax()))
    assert drafts == [2, 1, 1]  # 1 -> 2 (counts), then 2 -> 1 from the draft; 4 has no bigram: unigram (1 twice)
    assert torch.allclose(q.sum(-1), torch.ones(3)) and q[:, MASK].eq(0).all()


@pytest.mark.parametrize("drafter", ["self", "ngram"])
@pytest.mark.parametrize("order", ["left_to_right", "random"])
@pytest.mark.parametrize("k", [3, 5, 8])
def test_greedy_equals_sequential_greedy(xlnet, order, k, drafter):
    tokens = [1, MASK, 2, *[MASK] * 12, 3, MASK, MASK]
    for seed in range(3):
        sampling = SamplingParams(seed=seed)
        got = infill(xlnet, tokens, MASK, AssdConfig(k=k, order=order, drafter=drafter), sampling)
        want = infill(xlnet, tokens, MASK, AssdConfig(k=k, order=order, drafter="none"), sampling)
        assert got.token_ids == want.token_ids
        assert want.nfe == want.generated == 15
        if drafter == "self":
            assert got.nfe < got.generated  # drafts accepted: fewer calls than tokens
        else:  # one call per iteration, each commits at least one token; the n-gram calls counted apart
            assert got.nfe <= got.generated and got.draft_calls >= 1


def test_the_given_tokens_see_each_other_and_the_rest_follows_sigma():
    # positions 0 and 2 given (ranks 0, 1), then holes 3 and 1 in that order (ranks 2, 3); 4 undecoded
    ranks = torch.tensor([0.0, 3.0, 1.0, 2.0, 5.0])
    given = torch.tensor([True, False, True, False, False])
    sees = perm_mask(ranks, given) == 0
    assert sees[0, 2] and sees[2, 0]  # the conditioning attends both ways (seed 004, section 3)
    assert not sees.diagonal().any()  # no query row sees its own token (the content stream adds itself)
    assert sees[3].tolist() == [True, False, True, False, False]  # hole ranked 2: the given ones
    assert sees[1].tolist() == [True, False, True, True, False]  # hole ranked 3: the given ones and hole 3
    assert not sees[0, 3] and not sees[0, 1]  # a given token never sees a hole
    assert sees[4].tolist() == [True, True, True, True, False]


def test_explicit_holes():
    assert with_holes([1, 2, 3, 4], [0, -1], MASK) == [MASK, 2, 3, MASK]
    with pytest.raises(ConfigError, match="holes must be token positions"):
        with_holes([1, 2], [2], MASK)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_small_k_refused_saying_why(k):
    with pytest.raises(ConfigError, match=r"k must be an integer >= 3 .*sequential"):
        AssdConfig(k=k)


@pytest.mark.parametrize("settings,field", [({"drafter": "oracle"}, "drafter"), ({"order": "backwards"}, "order")])
def test_bad_settings_refused_by_name(settings, field):
    with pytest.raises(ConfigError, match=field):
        AssdConfig(**settings)
