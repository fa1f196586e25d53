"""A grammar (structured output) on the logit rows of one forward: each row is masked with the grammar's state after
the tokens it follows, its history, so what a method picks from it is what constrained decoding allows there.

A row's history is the forward's tokens it sees at logical positions from the committed end up to the position it
predicts (`Forward.predicted`). Where that run is complete (no mask, no gap) the row is masked; where it is not (a
WeDLM mask after another mask, a diffusion slot after an unrevealed one) nothing is known of the grammar's state there
and the row stays open. A lossless method's verify chain `[seed, d_1 .. d_k]` is the case where row j's history is
d_1 .. d_j: the drafts are verified against the constrained distribution, and the committed run is what constrained
AR decoding gives (greedy or sampled). A committing method whose choices come from open rows settles them before they
are committed (`Decoder.settle`: a slot the grammar rejects is masked again).

The walk only looks ahead: it accepts along the histories, sharing their common prefixes, and rolls back all it
accepted. Whoever owns the grammar advances it over what a step commits: the decoder itself (`Decoder.commit`) for
the reference runner and the committing methods, SGLang's scheduler for its verify worker (`constrain`)."""

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from parallel_decoding.common.window import Forward


class Grammar(Protocol):
    """What the walk needs of a grammar (SGLang's `BaseGrammarObject` has these; `Matcher` wraps xgrammar's)."""

    def accept_token(self, token: int) -> Any: ...

    def rollback(self, k: int) -> None: ...

    def is_terminated(self) -> bool: ...

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None: ...


class Matcher:
    """An xgrammar `GrammarMatcher` as a `Grammar` (a decoder's own: compiled by the engine adapter or the caller
    from the request's constraint, with unbounded rollback)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accept_token(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def rollback(self, k: int) -> None:
        self.matcher.rollback(k)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)


class Joint:
    """Several grammars at once (a request's structured output and its bad words, `common.bad_words`): a token is
    accepted where every one that has not ended accepts it, a row allows what all of them allow, and it ends when
    they all have."""

    def __init__(self, grammars: Sequence[Grammar]) -> None:
        self.grammars = list(grammars)
        self.took: list[list[Grammar]] = []  # per accepted token, the grammars it advanced

    def accept_token(self, token: int) -> bool:
        took: list[Grammar] = []
        for grammar in self.grammars:
            if grammar.is_terminated():
                continue
            if not accepts(grammar, token):
                for advanced in took:
                    advanced.rollback(1)
                return False
            took.append(grammar)
        self.took.append(took)
        return True

    def rollback(self, k: int) -> None:
        for _ in range(k):
            for grammar in self.took.pop():
                grammar.rollback(1)

    def is_terminated(self) -> bool:
        return all(grammar.is_terminated() for grammar in self.grammars)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        scratch = torch.empty((1, vocab_mask.shape[-1]), dtype=vocab_mask.dtype)
        for grammar in self.grammars:
            if not grammar.is_terminated():
                scratch.fill_(-1)
                grammar.fill_vocab_mask(scratch, 0)
                vocab_mask[idx] &= scratch[0].to(vocab_mask.device)


def joint(*grammars: Grammar | None) -> Grammar | None:
    """The grammars given (None: none), as one."""
    present = [grammar for grammar in grammars if grammar is not None]
    return None if not present else present[0] if len(present) == 1 else Joint(present)


def accepts(grammar: Grammar, token: int) -> bool:
    """Advance `grammar` over `token` if it allows it (SGLang's raises where xgrammar's answers False)."""
    if grammar.is_terminated():
        return False
    try:
        return grammar.accept_token(token) is not False
    except ValueError:
        return False


def valid_prefix(grammar: Grammar, tokens: Sequence[int]) -> int:
    """How many leading `tokens` the grammar accepts in turn from its state (left unchanged); once it has ended,
    all that follow (nothing constrains them, as `Decoder.commit` takes them)."""
    count = accepted = 0
    for token in tokens:
        if grammar.is_terminated():
            count = len(tokens)
            break
        if not accepts(grammar, token):
            break
        count += 1
        accepted += 1
    if accepted:
        grammar.rollback(accepted)
    return count


def packed_width(vocab_size: int) -> int:
    """int32 words of a packed token bitmask row (xgrammar's layout: bit t % 32 of word t // 32)."""
    return (vocab_size + 31) // 32


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean [rows, vocab_size] of the tokens a packed bitmask allows."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask[..., None] >> bits) & 1).bool().flatten(-2)[..., :vocab_size]


def fill_rows(grammar: Grammar, histories: Sequence[Sequence[int] | None], bitmask: torch.Tensor, start: int = 0
              ) -> None:
    """Packed masks of rows `start + r`: the grammar's state after `histories[r]`. Rows without a history (None), or
    whose history the grammar rejects or ends within, keep what `bitmask` held (everything allowed)."""
    accepted: list[int] = []
    for r in sorted((r for r, h in enumerate(histories) if h is not None), key=lambda r: list(histories[r])):
        history = list(histories[r])
        shared = 0
        while shared < min(len(accepted), len(history)) and accepted[shared] == history[shared]:
            shared += 1
        if len(accepted) > shared:
            grammar.rollback(len(accepted) - shared)
            del accepted[shared:]
        for token in history[shared:]:
            if not accepts(grammar, token):
                break
            accepted.append(token)
        if len(accepted) == len(history) and not grammar.is_terminated():
            grammar.fill_vocab_mask(bitmask, start + r)
    if accepted:
        grammar.rollback(len(accepted))


def histories(forward: Forward, committed: int, mask_token_id: int | None) -> list[list[int] | None]:
    """Each logit row's history: the tokens it sees at positions `committed` .. (what it predicts) - 1, in order,
    where they are all there and none is the mask; None where they are not."""
    rows, positions, tokens = forward.logit_rows, forward.positions, forward.token_ids
    predicted = forward.predicted
    inside = forward.visibility()[rows] & (positions[None, :] >= committed) & (positions[None, :] < predicted[:, None])
    complete = inside.sum(-1) == (predicted - committed).clamp(min=0)
    if mask_token_id is not None:
        complete &= ~(inside & (tokens == mask_token_id)[None, :]).any(-1)
    out: list[list[int] | None] = []
    for r, whole in enumerate(complete.tolist()):
        if not whole:
            out.append(None)
            continue
        seen = inside[r].nonzero().squeeze(-1)
        order = positions[seen].argsort()
        run = positions[seen][order]
        gapless = bool((run == torch.arange(committed, committed + len(run))).all())
        out.append(tokens[seen][order].tolist() if gapless else None)
    return out


def masked(logits: torch.Tensor, grammar: Grammar, forward: Forward, committed: int, mask_token_id: int | None
           ) -> torch.Tensor:
    """`logits` ([rows, V], `forward`'s logit rows in order) as float32, each row whose history is known masked
    (-inf) with the grammar's state after it."""
    bitmask = torch.full((len(logits), packed_width(logits.shape[-1])), -1, dtype=torch.int32)
    fill_rows(grammar, histories(forward, committed, mask_token_id), bitmask)
    return logits.float().masked_fill(~unpack(bitmask.to(logits.device), logits.shape[-1]), float("-inf"))


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
        chain = drafts[i][: width - 1]
        fill_rows(grammars[i], [chain[:j] for j in range(len(chain) + 1)], bitmask, n * width)
    allowed_tokens = unpack(bitmask.to(logits.device), vocab).view(len(rows), width, vocab)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed_tokens, float("-inf"))
    return logits
