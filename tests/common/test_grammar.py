"""`common.grammar`: a verify chain's rows masked by the grammar after the drafts before each (what constrained AR
decoding allows at that position), rows past a rejected draft left open, unconstrained requests untouched, and the
engine's grammar object left where it was."""

import pytest
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from parallel_decoding.common.grammar import constrain, packed_width, unpack

PATTERN = r"\d{3}-\d{2}"


class Matcher:
    """SGLang's grammar-object interface over an xgrammar matcher."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)

    def accept_token(self, token: int) -> None:
        assert self.matcher.accept_token(token), token

    def rollback(self, k: int) -> None:
        self.matcher.rollback(k)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)


@pytest.fixture(scope="module")
def grammar(real_model):
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    vocab = len(tokenizer)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)).compile_regex(
        PATTERN)
    return tokenizer, vocab, compiled


def allowed_after(compiled, prefix: list[int], vocab: int) -> torch.Tensor:
    """What a fresh matcher allows after `prefix` (constrained AR's mask there)."""
    matcher = Matcher(compiled)
    for token in prefix:
        matcher.accept_token(token)
    bitmask = torch.full((1, packed_width(vocab)), -1, dtype=torch.int32)
    matcher.fill_vocab_mask(bitmask, 0)
    return unpack(bitmask, vocab)[0]


def test_chain_rows_masked_as_constrained_ar(grammar):
    tokenizer, vocab, compiled = grammar
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "123-4"]
    bad = [digits[0], tokenizer.convert_tokens_to_ids("x"), digits[2]]
    matchers = [Matcher(compiled), None, Matcher(compiled)]
    logits = torch.randn(3, 6, vocab, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    constrain(matchers, [digits, digits, bad], logits)
    for j in range(6):  # the valid chain: row j after its first j drafts
        want = allowed_after(compiled, digits[:j], vocab)
        assert torch.equal(torch.isfinite(logits[0, j]), want), j
        assert torch.equal(logits[0, j][want], original[0, j][want])
    assert torch.equal(logits[1], original[1]), "an unconstrained request's rows changed"
    assert torch.equal(torch.isfinite(logits[2, 1]), allowed_after(compiled, bad[:1], vocab))
    assert not torch.isfinite(logits[2, 1, bad[1]]), "the rejected draft is not masked on its row"
    assert torch.equal(logits[2, 2:], original[2, 2:]), "rows past a rejected draft are masked"
    for matcher in matchers[::2]:  # rolled back: the engine's grammar still at the start
        assert torch.equal(allowed_after(compiled, [], vocab), allowed_after_object(matcher, vocab))


def allowed_after_object(matcher: Matcher, vocab: int) -> torch.Tensor:
    bitmask = torch.full((1, packed_width(vocab)), -1, dtype=torch.int32)
    matcher.fill_vocab_mask(bitmask, 0)
    return unpack(bitmask, vocab)[0]
