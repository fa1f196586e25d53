"""How close a decoding decision came to going the other way, relative to the size of what it compared.

Differently shaped float32 kernels (another batch, another CPU) may break a decision whose margin is a few ulps
the other way; tests that compare token sequences across computations cut them at the first such decision.
"""

import torch


def top2_rows(logits: torch.Tensor) -> torch.Tensor:
    """Per row, (top-1 - top-2 logit) / max |finite logit|: the slack of the row's argmax."""
    logits = logits.float()
    best = logits.topk(2, dim=-1).values
    scale = logits.masked_fill(~logits.isfinite(), 0.0).abs().amax(-1).clamp_min(1e-30)
    return (best[..., 0] - best[..., 1]) / scale


def top2(logits: torch.Tensor) -> float:
    """Smallest `top2_rows` over rows: the slack of the rows' argmax."""
    if logits.shape[-1] < 2 or logits.numel() == 0:
        return float("inf")
    return float(top2_rows(logits).min())


def threshold(values: torch.Tensor, tau: float) -> float:
    """Smallest |value - tau| / max(|tau|, 1): the slack of `value < tau` decisions."""
    if values.numel() == 0:
        return float("inf")
    return float((values.float() - tau).abs().min() / max(abs(tau), 1.0))


def gap(values: torch.Tensor) -> float:
    """Gap between the two smallest values / max(|smallest|, 1): the slack of an argmin (or of an argmax, negated)."""
    if values.numel() < 2:
        return float("inf")
    low = values.float().topk(2, largest=False).values
    return float((low[1] - low[0]) / max(float(low[0].abs()), 1.0))
