"""Bad words as a grammar (`common.bad_words`): what it bans after an output is what vLLM's sampler bans, joined with
another grammar it allows what both allow and rolls back what it accepted; on the tiny checkpoints the lossless
methods equal AR under the same words, token for token, and the committing methods' outputs never hold one, where
their plain outputs do."""

import itertools
import random

import pytest
import torch

from parallel_decoding.common.bad_words import BadWords
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.grammar import Joint, packed_width, unpack
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams
from tests.support import ties

VOCAB = 40


def banned_by_vllm(words: list[list[int]], output: list[int]) -> set[int]:
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    logits = torch.zeros(1, VOCAB)
    apply_bad_words(logits, {0: words}, [list(output)])
    return set(torch.isinf(logits[0]).nonzero().flatten().tolist())


def allowed(grammar, vocab: int = VOCAB) -> set[int]:
    bitmask = torch.full((1, packed_width(vocab)), -1, dtype=torch.int32)
    grammar.fill_vocab_mask(bitmask, 0)
    return set(unpack(bitmask, vocab)[0].nonzero().flatten().tolist())


def test_bans_what_vllm_bans():
    pytest.importorskip("vllm")
    rng = random.Random(0)
    words = [[3], [5, 6], [5, 6, 7], [31, 33], [1, 1, 1]]  # 31 and 33 straddle a 32-bit word of the mask
    for _ in range(100):
        grammar = BadWords(words)
        for token in [rng.choice([1, 3, 5, 6, 7, 31, 32, 33]) for _ in range(8)]:
            banned = banned_by_vllm(words, grammar.output)
            assert set(range(VOCAB)) - allowed(grammar) == banned
            assert grammar.accept_token(token) == (token not in banned)


class OddOnly:
    """A scripted grammar: odd tokens only, ended by token 9."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept_token(self, token: int) -> bool:
        if token % 2 == 0:
            return False
        self.accepted.append(token)
        return True

    def rollback(self, k: int) -> None:
        del self.accepted[len(self.accepted) - k:]

    def is_terminated(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == 9

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        bits = torch.arange(packed_width(VOCAB) * 32) % 2 == 1
        vocab_mask[idx] = (bits.view(-1, 32).long() << torch.arange(32)).sum(-1).to(torch.int32)


def test_joint_allows_what_both_allow_and_rolls_back():
    odd, words = OddOnly(), BadWords([[3, 5]])
    joint = Joint([odd, words])
    assert joint.accept_token(3) and not joint.accept_token(5) and not joint.accept_token(4)
    assert odd.accepted == [3] and words.output == [3]  # a token one of them rejects advances neither
    assert allowed(joint) == set(range(1, VOCAB, 2)) - {5}
    assert joint.accept_token(9) and odd.is_terminated() and not joint.is_terminated()
    assert joint.accept_token(4) and odd.accepted == [3, 9] and words.output == [3, 9, 4]  # the ended one is left
    joint.rollback(3)
    assert odd.accepted == [] and words.output == [] and allowed(joint) == set(range(1, VOCAB, 2))


LOSSLESS = [("jacobi", {"block_size": 4}), ("jacobi", {"block_size": 4, "pool_size": 4}),
            ("diffusion_self", {"num_speculative_tokens": 3}),
            ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3}), ("wedlm_spec", {"window": 4})]
COMMITTING = [("wedlm", {"window": 8, "entropy_threshold": 5.0}), ("diffusion", {"block_size": 8,
                                                                                 "confidence_threshold": 0.1})]
MAX_TOKENS = 24


def outputs(model, method: str, settings: dict, prompts: list[list[int]], words: list[list[int]]) -> list:
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    got = []
    for prompt in prompts:
        decoder = make_decoder(method, config, prompt, SamplingParams(), Limits(MAX_TOKENS))
        decoder.grammar = BadWords(words) if words else None
        got.append(ReferenceRunner(model).run(decoder))
    return got


def holds(tokens: list[int], word: list[int]) -> bool:
    return any(tokens[i : i + len(word)] == word for i in range(len(tokens)))


@pytest.mark.parametrize(("method", "settings"), LOSSLESS + COMMITTING,
                         ids=[f"{m}-{'-'.join(map(str, s.values()))}" for m, s in LOSSLESS + COMMITTING])
def test_decoders_under_bad_words(qwen3, prompts, method, settings):
    model, tokenizer = qwen3
    ids = [tokenizer.encode(p) for p in prompts[:4]]
    plain = [r.token_ids for r in outputs(model, method, settings, ids, [])]
    words = [list(pair) for pair in dict.fromkeys(itertools.chain.from_iterable(
        list(itertools.pairwise(tokens))[3:5] for tokens in plain))]  # two-token words each plain output holds
    got = [r.token_ids for r in outputs(model, method, settings, ids, words)]
    assert got != plain and not any(holds(tokens, word) for tokens in got for word in words)
    if (method, settings) in LOSSLESS:
        ar = outputs(model, "ar", {}, ids, words)
        ties.compare(got, [r.token_ids for r in ar], [r.margins for r in ar])
