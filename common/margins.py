"""How close a decoding decision came to going the other way, relative to the size of what it compared.

Differently shaped float32 kernels (another batch, another CPU) may break a decision whose margin is a few ulps
the other way; tests that compare token sequences across computations cut them at the first such decision.
"""

import torch


def top2_rows(logits: torch.Tensor, token: torch.Tensor | None = None) -> torch.Tensor:
    """Per row, (top-1 - top-2 logit) / max |finite logit|: the slack of the row's argmax (`token`, when the caller
    has it). Vectorised reductions only (`topk` and `isfinite` run 5-20x slower on CPU), equal to them bit for bit."""
    logits = logits.float()
    if token is None:
        token = logits.argmax(-1)
    best = logits.gather(-1, token[..., None])[..., 0]
    second = logits.scatter(-1, token[..., None], float("-inf")).amax(-1)
    scale = logits.abs().nan_to_num(nan=0.0, posinf=0.0).amax(-1).clamp_min(1e-30)
    return (best - second) / scale


def top2(logits: torch.Tensor) -> float:
    """Smallest `top2_rows` over rows: the slack of the rows' argmax."""
    if logits.shape[-1] < 2 or logits.numel() == 0:
        return float("inf")
    return float(top2_rows(logits).min())


def threshold_rows(values: torch.Tensor, valid: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Per row of `values` [R, S], the smallest |value - tau| / max(|tau|, 1) over its `valid` entries, `tau` one
    threshold per row: the slack of its `value < tau` decisions (inf: no entry, or no threshold, an infinite tau)."""
    tau = tau.float()[:, None]
    slack = ((values.float() - tau).abs() / tau.abs().clamp_min(1.0)).masked_fill(~valid, float("inf"))
    return torch.where(tau[:, 0].isfinite(), slack.amin(-1), float("inf"))


def gap_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row, the gap between its two smallest `valid` values / max(|smallest|, 1): the slack of an argmin (or
    of an argmax, negated); inf for a row with fewer than two."""
    if values.shape[-1] < 2:
        return torch.full(values.shape[:1], float("inf"))
    low = values.float().masked_fill(~valid, float("inf")).topk(2, dim=-1, largest=False).values
    return ((low[:, 1] - low[:, 0]) / low[:, 0].abs().clamp_min(1.0)).nan_to_num(nan=float("inf"))


class DecisionMargins:
    """Mixed into a decoder with `output` (its generated tokens) and `margins` lists: per generated position, the
    smallest slack of the decisions taken while it was next."""

    output: list[int]
    margins: list[float]

    def note_margin(self, margin: float) -> None:
        """Record a decision's slack: `margins[i]` is the smallest slack of the decisions taken while `i` tokens
        were generated; float rounding that flips one of them can change tokens from `i` on."""
        position = len(self.output)
        self.margins += [float("inf")] * (position + 1 - len(self.margins))
        self.margins[position] = min(self.margins[position], margin)

    @property
    def decision_margins(self) -> list[float]:
        """Per generated token, the smallest slack of the decisions taken while it was next (inf: none)."""
        return (self.margins + [float("inf")] * len(self.output))[: len(self.output)]
