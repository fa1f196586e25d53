"""Bad words (vLLM's `bad_words`) as a grammar over the output: a token that would end one of the words, after the
output tokens before it, is never chosen. vLLM's rule (`vllm/v1/sample/ops/bad_words.py`): a word of n tokens bans its
last token where the n - 1 tokens before are its first ones (a one-token word always), over generated tokens only.

As a `common.grammar.Grammar` it reaches every row a committing method decides: rows whose history is known are
masked, choices from open rows are settled before they are committed (`Decoder.settle`), and `Decoder.commit` stops
at a token that would end a word."""

import torch


class BadWords:
    """The words' token ids and the output accepted so far (the decoder advances it over what it commits)."""

    def __init__(self, words: list[list[int]]) -> None:
        self.words = [list(word) for word in words if word]
        self.output: list[int] = []

    def banned(self) -> list[int]:
        """The tokens that would end a word after the output so far."""
        return [word[-1] for word in self.words
                if len(word) <= len(self.output) + 1 and self.output[len(self.output) - len(word) + 1:] == word[:-1]]

    def accept_token(self, token: int) -> bool:
        if token in self.banned():
            return False
        self.output.append(token)
        return True

    def rollback(self, k: int) -> None:
        del self.output[len(self.output) - k:]

    def is_terminated(self) -> bool:
        return False

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        """Clear the banned tokens' bits in row `idx` of a packed mask (xgrammar's layout), leaving the others."""
        for token in set(self.banned()):
            word, bit = divmod(token, 32)
            cleared = int(vocab_mask[idx, word]) & ~(1 << bit)
            vocab_mask[idx, word] = (cleared + 2**31) % 2**32 - 2**31  # as int32
