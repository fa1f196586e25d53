"""What one forward must contain, and what a method makes of its logits."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class Attention(Enum):
    """Attention among the forwarded rows; the cached prefix is always fully visible."""

    CAUSAL = "causal"
    BIDIRECTIONAL = "bidirectional"
    CUSTOM = "custom"


@dataclass(frozen=True)
class Forward:
    """One forward over the cached prefix: rows in physical order with their logical (RoPE) positions."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    logit_rows: torch.Tensor
    attention: Attention = Attention.CAUSAL
    mask: torch.Tensor | None = None
    adapter: str | None = None
    adapter_rows: torch.Tensor | None = None  # indices of the rows the adapter applies to (None: every row)
    targets: torch.Tensor | None = None  # the logical position each logit row predicts (None: its own + 1, causal)

    def __post_init__(self) -> None:
        if (self.attention is Attention.CUSTOM) != (self.mask is not None):
            raise ValueError("an explicit mask is given exactly when attention is CUSTOM")

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def predicted(self) -> torch.Tensor:
        """The logical position each logit row predicts."""
        return self.positions[self.logit_rows] + 1 if self.targets is None else self.targets

    def visibility(self) -> torch.Tensor:
        """Boolean [n, n]: row i may attend to forwarded row j."""
        n = self.num_tokens
        if self.attention is Attention.CAUSAL:
            return torch.ones(n, n, dtype=torch.bool).tril()
        if self.attention is Attention.BIDIRECTIONAL:
            return torch.ones(n, n, dtype=torch.bool)
        return self.mask


@dataclass
class Outcome:
    """Tokens committed by one forward and how many leading forwarded rows keep their KV."""

    committed: list[int] = field(default_factory=list)
    kv_keep: int = 0


def causal_forward(token_ids: list[int], start: int, logit_rows: list[int], **kwargs: Any) -> Forward:
    """A forward over consecutive logical positions starting at `start`."""
    n = len(token_ids)
    return Forward(
        token_ids=torch.tensor(token_ids, dtype=torch.long),
        positions=torch.arange(start, start + n, dtype=torch.long),
        logit_rows=torch.tensor(logit_rows, dtype=torch.long),
        **kwargs,
    )


def after_rows(forward: Forward | None, token_ids: list[int], start: int) -> Forward:
    """`forward` preceded by causal rows of `token_ids` at logical positions `start`...: tokens whose KV the
    method counts as cached but an engine's cache lacks (the engine recomputes them in the same forward).

    `forward` (None: the rows alone) sees every prepended row; its `logit_rows` are shifted past them. A causal
    `forward` stays causal (and one with no rows to prepend stays as it is), so no mask is built for it."""
    rows = causal_forward(token_ids, start, [])
    if forward is None:
        return rows
    n, m = rows.num_tokens, forward.num_tokens
    if n == 0:
        return forward
    if forward.attention is Attention.CAUSAL:
        return Forward(token_ids=torch.cat([rows.token_ids, forward.token_ids]),
                       positions=torch.cat([rows.positions, forward.positions]),
                       logit_rows=forward.logit_rows + n, adapter=forward.adapter,
                       adapter_rows=shifted(forward.adapter_rows, n), targets=forward.targets)
    mask = torch.zeros(n + m, n + m, dtype=torch.bool)
    mask[:n, :n] = rows.visibility()
    mask[n:, :n] = True
    mask[n:, n:] = forward.visibility()
    return Forward(
        token_ids=torch.cat([rows.token_ids, forward.token_ids]),
        positions=torch.cat([rows.positions, forward.positions]),
        logit_rows=forward.logit_rows + n,
        attention=Attention.CUSTOM,
        mask=mask,
        adapter=forward.adapter,
        adapter_rows=shifted(forward.adapter_rows, n),
        targets=forward.targets,
    )


def shifted(rows: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """Row indices moved past `n` prepended rows (None stays None: every row)."""
    return None if rows is None else rows + n


def rectangular(forwards: list[Forward], pad_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Several requests' forwards as one rectangular batch (an engine's fixed-width window): tokens [B, W] padded
    with `pad_token`, and per request a [W, W] visibility with its forward's own in the top-left corner and causal
    rows past it (padding no request reads)."""
    width = max(forward.num_tokens for forward in forwards)
    tokens = torch.full((len(forwards), width), pad_token)
    visible = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(forwards), 1, 1)
    for row, forward in enumerate(forwards):
        n = forward.num_tokens
        tokens[row, :n] = forward.token_ids
        visible[row, :n, :n] = forward.visibility()
    return tokens, visible
