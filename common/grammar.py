"""A grammar (structured output) walked along each request's verify chain: row j of `[seed, d_1 .. d_k]` is masked
with the grammar's state after d_1 .. d_j, so every draft is verified against the constrained distribution and the
committed run is what constrained AR decoding gives (lossless under a constraint, greedy or sampled).

The engines own the grammar objects (their xgrammar matchers) and advance them over what a step commits; the walk
only looks ahead and rolls back what it accepted. A draft the grammar rejects is masked out on its own row, so no
draft after it can be accepted."""

from typing import Any, Protocol

import torch


class Grammar(Protocol):
    """What the walk needs of an engine's grammar object (SGLang's `BaseGrammarObject` has these)."""

    def accept_token(self, token: int) -> Any: ...

    def rollback(self, k: int) -> None: ...

    def is_terminated(self) -> bool: ...

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None: ...


def packed_width(vocab_size: int) -> int:
    """int32 words of a packed token bitmask row (xgrammar's layout: bit t % 32 of word t // 32)."""
    return (vocab_size + 31) // 32


def allowed(row: torch.Tensor, token: int) -> bool:
    """Whether a packed bitmask row allows `token`."""
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def fill_chain(grammar: Grammar, drafts: list[int], bitmask: torch.Tensor, start: int) -> None:
    """Packed masks for a chain's rows `start .. start + len(drafts)`: row j is the grammar's state after the first j
    drafts. Rows past a rejected draft, or past the grammar's end, keep what `bitmask` held (everything allowed): no
    draft there can be accepted, and the engine drops what follows the end."""
    accepted = 0
    for j in range(len(drafts) + 1):
        if grammar.is_terminated():
            break
        grammar.fill_vocab_mask(bitmask, start + j)
        if j == len(drafts) or not allowed(bitmask[start + j], drafts[j]):
            break
        grammar.accept_token(drafts[j])
        accepted += 1
    if accepted:
        grammar.rollback(accepted)


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean [rows, vocab_size] of the tokens a packed bitmask allows."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask[..., None] >> bits) & 1).bool().flatten(-2)[..., :vocab_size]


def constrain(grammars: list[Grammar | None], drafts: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """`logits` [requests, width, vocab] of a verify forward (request i's chain `[seed, *drafts[i]]` on its first
    rows) with each constrained request's rows masked (-inf) along its chain, in place; unconstrained requests'
    rows untouched."""
    rows = [i for i, grammar in enumerate(grammars) if grammar is not None]
    if not rows:
        return logits
    width, vocab = logits.shape[1], logits.shape[2]
    bitmask = torch.full((len(rows) * width, packed_width(vocab)), -1, dtype=torch.int32)
    for n, i in enumerate(rows):
        fill_chain(grammars[i], drafts[i][: width - 1], bitmask, n * width)
    allowed_tokens = unpack(bitmask.to(logits.device), vocab).view(len(rows), width, vocab)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed_tokens, float("-inf"))
    return logits
