"""One recurrent-depth forward: rows with their latents and recurrences in, latents and logits out; the model
class the engines run (`StagedRaven`) reads the rows staged for it; the latents a position starts from."""

from dataclasses import dataclass

import torch

from parallel_decoding.common.huginn.config import LATENT_SEED_STRIDE
from parallel_decoding.common.models.raven import Cache, KVCache, RavenConfig, RavenForCausalLM


@dataclass
class RecurrentForward:
    """Rows at positions start.. (after `start` cached positions): tokens, the latents the core starts from,
    `inner` recurrences numbered from `first_recurrence`, and the previous step's embeddings of the leading rows
    (mixed in with weight `ema`)."""

    token_ids: torch.Tensor
    start: int
    latents: torch.Tensor
    inner: int
    first_recurrence: int = 0
    previous_embeds: torch.Tensor | None = None
    ema: float = 0.0

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.token_ids.numel())


@dataclass
class RecurrentOutput:
    latents: torch.Tensor
    logits: torch.Tensor
    embeds: torch.Tensor


@dataclass
class RecurrentRows:
    """The recurrent state of the rows of one or more forwards, concatenated as an engine batches them: each row's
    starting latent, recurrence count and, where `mixed`, the previous embedding mixed in with weight `ema`."""

    latents: torch.Tensor
    inner: torch.Tensor
    previous_embeds: torch.Tensor
    mixed: torch.Tensor
    ema: float = 0.0
    first_recurrence: int = 0

    @classmethod
    def of(cls, forwards: list[RecurrentForward]) -> "RecurrentRows":
        """The rows of `forwards` in order (one `ema` and `first_recurrence` for all: one config per engine)."""
        latents = torch.cat([f.latents for f in forwards])
        previous, mixed = torch.zeros_like(latents), torch.zeros(latents.shape[0], dtype=torch.bool)
        start = 0
        for f in forwards:
            if f.previous_embeds is not None and f.ema > 0:
                previous[start : start + f.previous_embeds.shape[0]] = f.previous_embeds
                mixed[start : start + f.previous_embeds.shape[0]] = True
            start += f.token_ids.numel()
        inner = torch.cat([torch.full((f.token_ids.numel(),), f.inner) for f in forwards])
        return cls(latents, inner, previous, mixed, max((f.ema for f in forwards), default=0.0),
                   forwards[0].first_recurrence)


def unplanned_rows(model: RavenForCausalLM, positions: torch.Tensor) -> RecurrentRows:
    """What an engine's forward nobody planned runs: `mean_recurrence` recurrences from latent seed 0."""
    n = positions.shape[0]
    latents = torch.cat([initial_latents(model, 0, int(p), 1) for p in positions.tolist()]) if n else torch.zeros(
        0, model.config.n_embd)
    return RecurrentRows(latents, torch.full((n,), model.config.mean_recurrence), torch.zeros_like(latents),
                         torch.zeros(n, dtype=torch.bool))


@dataclass
class RowsOutput:
    latents: torch.Tensor
    hidden: torch.Tensor
    embeds: torch.Tensor


def run_rows(model: RavenForCausalLM, cache: Cache, token_ids: torch.Tensor, positions: torch.Tensor,
             rows: RecurrentRows) -> RowsOutput:
    """The batched forward both the reference and the engines run: prelude, each row's own number of core
    recurrences from its latent, coda; the coda's hidden states (the LM head is the caller's)."""
    e = model.embed(token_ids, positions, cache)
    if bool(rows.mixed.any()):
        # (1 - ema) e + ema e_prev, written so that an unchanged embedding stays bit for bit what it was
        e = torch.where(rows.mixed[:, None], e + rows.ema * (rows.previous_embeds.to(e) - e), e)
    z = model.recur_rows(rows.latents.to(e), e, positions, cache, rows.inner.to(e.device), rows.first_recurrence)
    return RowsOutput(z, model.hidden(z, positions, cache), e)


class StagedRaven(RavenForCausalLM):
    """The model as the engines run it: the `huginn` adapter stages the rows' recurrent state (`rows`) just before a
    forward and reads their latents and embeddings (`last`) after it; a forward nobody staged (warm-up, a prefill
    outside the method) runs `unplanned_rows`."""

    def __init__(self, config: RavenConfig) -> None:
        super().__init__(config)
        self.rows: RecurrentRows | None = None
        self.last: RowsOutput | None = None
        self.core_passes = 0  # sequential passes of the core block so far, the cost that sets a step's latency

    def run_staged(self, cache: Cache, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The coda's hidden states of one engine forward."""
        rows, self.rows = self.rows, None
        if rows is None:
            rows = unplanned_rows(self, positions)
        elif rows.latents.shape[0] != token_ids.shape[0]:
            raise RuntimeError(f"{rows.latents.shape[0]} rows staged for a forward of {token_ids.shape[0]} tokens")
        self.last = run_rows(self, cache, token_ids, positions, rows)
        self.core_passes += int(rows.inner.max()) if rows.inner.numel() else 0
        return self.last.hidden


def run_forward(model: RavenForCausalLM, cache: KVCache, forward: RecurrentForward) -> RecurrentOutput:
    """Execute one forward on `cache` (cropped to the rows' start first)."""
    cache.crop(forward.start)
    out = run_rows(model, cache, forward.token_ids, forward.positions, RecurrentRows.of([forward]))
    return RecurrentOutput(out.latents, model.lm_head(out.hidden).float(), out.embeds)


def initial_latents(model: RavenForCausalLM, seed: int, start: int, count: int, scale: float = 1.0) -> torch.Tensor:
    """The initial latents of positions start.. of a request whose latent seed is `seed`: each position's own
    draw, so a position starts from the same latent in every sampler, engine and batch; [count, d]."""
    generators = (torch.Generator().manual_seed(seed * LATENT_SEED_STRIDE + p) for p in range(start, start + count))
    return torch.stack([model.initial_latent(g, scale) for g in generators])
