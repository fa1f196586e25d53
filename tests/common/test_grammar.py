"""`common.grammar`: a verify chain's rows masked by the grammar after the drafts before each (what constrained AR
decoding allows at that position), rows past a rejected draft left open, unconstrained requests untouched, and the
engine's grammar object left where it was; each logit row's history in the windows of the committing methods (known
only where no mask or gap precedes what it predicts); a decided slot the grammar rejects undone before it is
committed."""

import pytest
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.diffusion import DiffusionConfig, DiffusionDecoder
from parallel_decoding.common.grammar import Matcher as XgrammarMatcher
from parallel_decoding.common.grammar import constrain, histories, packed_width, unpack
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.wedlm import WeDLMConfig, WeDLMDecoder

PATTERN = r"\d{3}-\d{2}"


class Matcher(XgrammarMatcher):
    """SGLang's grammar-object interface over an xgrammar matcher: a token it rejects raises."""

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        super().__init__(xgr.GrammarMatcher(compiled))

    def accept_token(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise ValueError(f"Tokens not accepted: {token}")


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


M = 99  # the mask token of the window tests


def test_histories_of_a_wedlm_window():
    """Filled slots first, masks after (causal in that order): a mask row's history is known up to the first
    mask or gap before its slot."""
    decoder = WeDLMDecoder([5, 6], SamplingParams(), Limits(32), WeDLMConfig(window=3, mask_token_id=M))
    decoder.output, decoder.cache_len = [7], 3
    decoder.slots, decoder.filled = [10, 11, M, 13, M], [True, True, False, True, False]
    forward = decoder.plan()
    assert forward.predicted.tolist() == [5, 7]
    assert histories(forward, decoder.num_tokens, M) == [[10, 11], None]
    decoder.slots, decoder.filled = [10, 11, 12, M, M], [True, True, True, False, False]
    assert histories(decoder.plan(), decoder.num_tokens, M) == [[10, 11, 12], None, None]  # one mask refilled


@pytest.mark.parametrize("dlm_type", ["llada", "dream"])
def test_histories_of_a_diffusion_block(dlm_type):
    """A block's slot rows (its own row, or the row before it under `dream`) predict their slot: known after a
    leading revealed run only."""
    config = DiffusionConfig(block_size=5, mask_token_id=M, dlm_type=dlm_type)
    decoder = DiffusionDecoder([5, 6], SamplingParams(), Limits(32), config)
    decoder.output, decoder.cache_len = [7], 2
    decoder._new_block()
    decoder.block[1:3], decoder._masked[1:3] = torch.tensor([20, 21]), False
    forward = decoder.plan()
    assert forward.predicted.tolist() == [3, 4, 5, 6]
    assert histories(forward, decoder.num_tokens, M) == [[], [20], [20, 21], None]


def test_a_rejected_slot_is_masked_again(grammar):
    """WeDLM: a filled slot the grammar rejects after the leading run before it becomes a mask before the next
    forward (filled slots after it stay), and nothing past what the grammar accepts is committed."""
    tokenizer, _, compiled = grammar
    digit, letter = (tokenizer.convert_tokens_to_ids(c) for c in "1x")
    decoder = WeDLMDecoder([5, 6], SamplingParams(), Limits(32), WeDLMConfig(window=4, mask_token_id=M))
    decoder.grammar = XgrammarMatcher(xgr.GrammarMatcher(compiled))
    decoder.forwards = 1
    decoder.slots, decoder.filled = [digit, letter, digit, M], [True, True, True, False]
    decoder.next_forward()
    assert decoder.slots[:4] == [digit, M, digit, M] and decoder.filled[:4] == [True, False, True, False]
    assert decoder.commit([digit, letter, digit]) == [digit]
