"""Any-subset speculative decoding (ASSD, seed 004) for any-subset autoregressive models (XLNet two-stream
attention), with infilling: fill the holes of a sequence in a decoding order sigma, k positions per iteration.

sigma ranks the given tokens first (left to right), then the holes left to right or in a random order. A pass asks
the model for the conditionals of some target positions given the positions ranked before them: `perm_mask` lets
position i see position j when j comes before i in sigma (undecoded positions come after everything), and lets the
given tokens see each other both ways (section 3: the conditioning's own density is never evaluated, so "every
token attend[s] to every other token within" it; the authors' code does the same). Each
iteration takes the next k positions of sigma: the draft pass gives q_j = p(x_j | decoded) for all of them at once
(mean field), drafts are drawn from q; the verify pass puts the drafts in sigma's order and gives
p_j = p(x_j | decoded, earlier drafts); drafts are accepted with min(1, p/q) and the first rejected one is
resampled from normalize(max(p - q, 0)). The output follows the model's joint in order sigma exactly (Theorem 2),
the first draft always passes (p = q there, Lemma 1), so model calls never exceed the tokens generated (Theorem 1);
the last token of a sequence is drafted and not verified. `drafter: none` is sequential any-order decoding, one
pass per token (the baseline). `drafter: ngram` (Appendix E.4, Algorithm 2) drafts from the sequence's own bigram
counts instead of a model pass, conditioned on the token left of each target (decoded, or drafted earlier in the
iteration): one model pass per iteration, but no Lemma 1 (the first draft can be rejected), so it accepts less.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from parallel_decoding.common.errors import ConfigError, require
from parallel_decoding.common.sampling import SamplingParams, target_probs, without_token

DRAFTERS = ("self", "ngram", "none")
ORDERS = ("left_to_right", "random")


@dataclass(frozen=True)
class AssdConfig:
    """k speculated positions per iteration; who drafts them; the order holes are filled in."""

    k: int = 5
    drafter: str = "self"
    order: str = "left_to_right"

    def __post_init__(self) -> None:
        require(isinstance(self.k, int) and self.k >= 3, "k",
                "an integer >= 3 (an iteration costs two passes, so k <= 2 cannot beat sequential decoding)", self.k)
        require(self.drafter in DRAFTERS, "drafter", f"one of {DRAFTERS}", self.drafter)
        require(self.order in ORDERS, "order", f"one of {ORDERS}", self.order)


@dataclass
class AssdResult:
    """The filled sequence; model calls (NFE); holes filled; n-gram draft calls (the paper's auxiliary NFE)."""

    token_ids: list[int]
    nfe: int
    generated: int
    draft_calls: int = 0

    @property
    def tokens_per_call(self) -> float:
        return self.generated / max(self.nfe, 1)


def decoding_order(tokens: list[int], mask_token_id: int, order: str, generator: torch.Generator) -> list[int]:
    """sigma: the given positions left to right, then the holes in `order`."""
    given = [i for i, t in enumerate(tokens) if t != mask_token_id]
    holes = [i for i, t in enumerate(tokens) if t == mask_token_id]
    if order == "random":
        holes = [holes[i] for i in torch.randperm(len(holes), generator=generator).tolist()]
    return given + holes


def with_holes(ids: list[int], holes: list[int], mask_token_id: int) -> list[int]:
    """`ids` with the token positions `holes` (explicit positions, negative from the end) made holes."""
    ids = list(ids)
    for position in holes:
        if not isinstance(position, int) or not -len(ids) <= position < len(ids):
            raise ConfigError(f"holes must be token positions in [{-len(ids)}, {len(ids)}), got {position!r}")
        ids[position] = mask_token_id
    return ids


def perm_mask(ranks: torch.Tensor, given: torch.Tensor) -> torch.Tensor:
    """XLNet's `perm_mask` [..., n, n] (1: i may not see j) for ranks [..., n] in sigma and the given positions
    [..., n] (bool): i sees j when j is ranked before i, or when both are given and j is not i (the conditioning,
    both ways; no query row sees its own token, and the content stream adds it itself)."""
    before = ranks[..., None, :] < ranks[..., :, None]
    n = ranks.shape[-1]
    both_given = given[..., None, :] & given[..., :, None] & ~torch.eye(n, dtype=torch.bool, device=given.device)
    return (~(before | both_given)).float()


def conditionals(model: torch.nn.Module, ids: list[int], ranks: torch.Tensor, given: torch.Tensor,
                 targets: list[int]) -> torch.Tensor:
    """Logits [len(targets), vocab] of each target position given the positions ranked before it (and the given
    positions, which see each other)."""
    n = len(ids)
    perm = perm_mask(ranks, given)
    mapping = torch.zeros(1, len(targets), n)
    mapping[0, torch.arange(len(targets)), torch.tensor(targets)] = 1.0
    with torch.inference_mode():
        out = model(torch.tensor([ids]), perm_mask=perm[None], target_mapping=mapping, use_mems=False)
    return out.logits[0].float()


def infill(model: torch.nn.Module, tokens: list[int], mask_token_id: int, config: AssdConfig,
           sampling: SamplingParams | None = None, on_step: Callable[[list[int]], None] | None = None) -> AssdResult:
    """Fill every `mask_token_id` in `tokens`; the model is an XLNet-style LM taking `perm_mask` and
    `target_mapping`. `on_step` sees the sequence after each iteration (holes still `mask_token_id`), for
    streaming."""
    sampling = sampling or SamplingParams()
    generator = sampling.generator()
    ids = list(tokens)
    sigma = decoding_order(ids, mask_token_id, config.order, generator)
    decoded = sum(t != mask_token_id for t in ids)
    ranks = torch.full((len(ids),), float(len(ids)))  # undecoded: after everything
    ranks[torch.tensor(sigma[:decoded], dtype=torch.long)] = torch.arange(decoded, dtype=torch.float)
    given = torch.tensor([t != mask_token_id for t in ids])
    nfe = draft_calls = 0

    def probs(logits: torch.Tensor) -> torch.Tensor:
        return target_probs(without_token(logits, mask_token_id), sampling)

    def draw(p: torch.Tensor) -> int:
        return int(p.argmax()) if sampling.greedy else int(torch.multinomial(p, 1, generator=generator))

    while decoded < len(ids):
        width = 1 if config.drafter == "none" else min(config.k, len(ids) - decoded)
        targets = sigma[decoded : decoded + width]
        if width == 1:  # nothing to speculate: one pass, one token
            accepted, tail = [draw(probs(conditionals(model, ids, ranks, given, targets))[0])], []
            nfe += 1
        else:
            if config.drafter == "ngram":
                drafts, q = bigram_drafts(ids, targets, mask_token_id, model.config.vocab_size, draw)
                draft_calls += 1
            else:
                q = probs(conditionals(model, ids, ranks, given, targets))
                nfe += 1
                drafts = [draw(row) for row in q]
            for j, position in enumerate(targets):
                ids[position], ranks[position] = drafts[j], decoded + j
            p = probs(conditionals(model, ids, ranks, given, targets))
            nfe += 1
            accepted, tail = accept(drafts, p, q, sampling, generator)
        for j, token in enumerate(accepted + tail):
            ids[targets[j]], ranks[targets[j]] = token, decoded + j
        for position in targets[len(accepted) + len(tail) :]:
            ids[position], ranks[position] = mask_token_id, float(len(ids))
        decoded += len(accepted) + len(tail)
        if on_step is not None:
            on_step(list(ids))
    return AssdResult(ids, nfe, len(sigma) - sum(t != mask_token_id for t in tokens), draft_calls)


def bigram_drafts(ids: list[int], targets: list[int], mask_token_id: int, vocab_size: int,
                  draw: Callable[[torch.Tensor], int]) -> tuple[list[int], torch.Tensor]:
    """Algorithm 2: the drafts and their distributions [len(targets), vocab] from the decoded tokens' bigram counts
    (Eq. 23, normalised over the bigrams seen), c(. | the token left of the target), that token decoded or drafted
    earlier in this iteration; the decoded tokens' unigram counts where no bigram starts there or the left neighbour
    is still undecoded (random order), uniform where nothing is decoded."""
    seq = torch.tensor(ids)
    known = seq != mask_token_id
    pair = known[:-1] & known[1:]
    counts = torch.zeros(vocab_size, vocab_size)
    counts.index_put_((seq[:-1][pair], seq[1:][pair]), torch.ones(int(pair.sum())), accumulate=True)
    unigram = torch.bincount(seq[known], minlength=vocab_size).float()
    if unigram.sum() == 0:
        unigram = torch.ones(vocab_size)
        unigram[mask_token_id] = 0
    drafted: dict[int, int] = {}
    rows = []
    for position in targets:
        left = position - 1
        cond = ids[left] if left >= 0 and ids[left] != mask_token_id else drafted.get(left)
        row = counts[cond] if cond is not None and counts[cond].sum() > 0 else unigram
        rows.append(row / row.sum())
        drafted[position] = draw(rows[-1])
    return [drafted[position] for position in targets], torch.stack(rows)


def accept(drafts: list[int], p: torch.Tensor, q: torch.Tensor, sampling: SamplingParams,
           generator: torch.Generator) -> tuple[list[int], list[int]]:
    """(accepted drafts, [the resampled token at the first rejection] or []): min(1, p/q) acceptance, residual
    normalize(max(p - q, 0)) on rejection; greedy: drafts equal to p's argmax, then p's argmax."""
    for j, token in enumerate(drafts):
        if sampling.greedy:
            if int(p[j].argmax()) != token:
                return drafts[:j], [int(p[j].argmax())]
            continue
        if float(torch.rand(1, generator=generator)) * float(q[j, token]) >= float(p[j, token]):
            residual = (p[j] - q[j]).clamp_min(0)
            return drafts[:j], [int(torch.multinomial(residual / residual.sum(), 1, generator=generator))]
    return drafts, []
