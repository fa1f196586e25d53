"""Lossless verification of drafted tokens against the target's own distributions."""

from dataclasses import dataclass, field

import torch

from parallel_decoding.common.sampling import SamplingParams, sample, target_probs


@dataclass
class AcceptanceStats:
    """Speculative-decoding counters in the form engines report them: per verified draft, how far it was accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted_per_position)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One verification of `num_drafted` drafts of which the leading `num_accepted` were accepted."""
        if num_drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.accepted_per_position += [0] * (num_drafted - len(self.accepted_per_position))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1


def leading_matches(drafts: torch.Tensor, predicted: torch.Tensor) -> int:
    """Length of the longest prefix on which `drafts` equals `predicted`."""
    same = (drafts == predicted[: drafts.numel()]).long()
    return int(same.cumprod(0).sum())


def accept_greedy(drafts: list[int], predicted: torch.Tensor) -> list[int]:
    """Greedy verification from the target's argmax per row (`predicted` has a row more than `drafts`): the
    matching drafts plus the target's token at the first mismatch: the batch of one of `accept_greedy_batch`."""
    return accept_greedy_batch([drafts], predicted[None])[0]


def accept_greedy_batch(drafts: list[list[int]], predicted: torch.Tensor) -> list[list[int]]:
    """Greedy verification of a batch of requests in one pass: `predicted` [requests, >= longest drafts + 1] holds
    each request's argmax rows."""
    width = max((len(d) for d in drafts), default=0)
    padded = torch.tensor([d + [-1] * (width - len(d)) for d in drafts], dtype=torch.long).view(len(drafts), width)
    accepted = (padded == predicted[:, :width]).long().cumprod(1).sum(1)  # -1 pads match no token
    tokens = predicted.gather(1, accepted[:, None])[:, 0].tolist()
    return [d[:a] + [t] for d, a, t in zip(drafts, accepted.tolist(), tokens, strict=True)]


def verify(
    drafts: torch.Tensor,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """Accepted drafts plus one target token (bonus or correction).

    `target_logits` has one row more than `drafts`: row i is the target's distribution for drafts[i].
    Greedy: exact match plus the target's argmax at the first mismatch. Sampling: speculative rejection
    sampling (Leviathan et al.) with `draft_probs` rows as the proposal, or a point mass on each draft
    when None (Jacobi), so the output follows the target distribution exactly.
    """
    k = drafts.numel()
    if params.greedy:
        return accept_greedy(drafts.tolist(), target_logits.argmax(-1))
    p = target_probs(target_logits, params)
    rows = torch.arange(k)
    p_draft = p[rows, drafts]
    q_draft = torch.ones(k) if draft_probs is None else draft_probs[rows, drafts]
    uniform = torch.rand(k, generator=generator)
    accepted = int((uniform * q_draft < p_draft).long().cumprod(0).sum())
    if accepted == k:
        return drafts.tolist() + [int(sample(p[k], generator))]
    if draft_probs is None:
        residual = p[accepted].clone()
        residual[drafts[accepted]] = 0
    else:
        residual = (p[accepted] - draft_probs[accepted]).clamp_min(0)
    return drafts[:accepted].tolist() + [int(sample(residual / residual.sum(), generator))]
