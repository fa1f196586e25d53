"""Huginn's diffusion-forcing sampler (seed 000, Algorithm 2) written as upstream's `generate_diffusion_style` is
laid out: one state tensor for the in-flight positions, one token sequence of frozen tokens and guesses, freezing
by index arithmetic on the cache length. Greedy; it shares only the model, its cache and the latent seeding with
`common.huginn`, so the decoder's per-row bookkeeping is checked against a second formulation.
"""

import torch

from parallel_decoding.common.huginn.config import LATENT_SEED_STRIDE
from parallel_decoding.common.models.raven import KVCache


def latent(model, seed: int, position: int, scale: float) -> torch.Tensor:
    """A position's initial latent as every sampler draws it (`common.huginn.forward.initial_latents`'s seeding)."""
    return model.initial_latent(torch.Generator().manual_seed(seed * LATENT_SEED_STRIDE + position), scale)


def relative(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return (new - old).norm(dim=-1) / new.norm(dim=-1).clamp_min(1e-12)


@torch.inference_mode()
def run(model, cache: KVCache, ids: list[int], start: int, states: torch.Tensor, inner: int,
        previous: torch.Tensor | None, ema: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward of `inner` recurrences: (logits, latents, the mixed input embeddings)."""
    positions = torch.arange(start, start + len(ids))
    e = model.embed(torch.tensor(ids), positions, cache)
    if previous is not None and ema > 0:
        e = e + ema * (previous.to(e) - e)
    z = model.recur_rows(states.to(e), e, positions, cache, torch.full((len(ids),), inner), 0)
    logits = model.lm_head(model.hidden(z, positions, cache)).float()
    return logits, z, e


def penalised(logits: torch.Tensor, seen: list[list[int]], penalty: float) -> torch.Tensor:
    """vLLM's repetition penalty on each row over the tokens it has seen (positive logits divided, others
    multiplied)."""
    logits = logits.clone()
    for row, tokens in enumerate(seen):
        index = torch.tensor(sorted(set(tokens)))
        values = logits[row, index]
        logits[row, index] = torch.where(values > 0, values / penalty, values * penalty)
    return logits


def wavefront(model, prompt: list[int], config, max_tokens: int, repetition_penalty: float = 1.0) -> list[int]:
    """The greedy tokens of `config` (a `common.huginn.config.HuginnConfig` with the `wavefront` sampler) after
    `prompt`, with latents drawn from seed 0 as a greedy request without a seed draws them; under vLLM's
    `repetition_penalty`, each position's prediction penalised for the tokens up to its own (prompt, frozen tokens,
    the guesses before it)."""
    seed, scale, inner = 0, config.init_scale, config.inner_recurrence
    noise = torch.Generator().manual_seed(seed)
    cache = KVCache(config.cache_lookup_strategy)
    p = len(prompt)
    initial = torch.stack([latent(model, seed, i, scale) for i in range(p)])
    first, _, _ = run(model, cache, prompt, 0, initial, config.num_steps, None, 0.0)
    frozen = [*prompt, int(penalised(first[-1:], [prompt], repetition_penalty).argmax())]
    sequence = list(frozen)
    counter = {i: config.num_steps for i in range(p + 1)}  # recurrences per position, the prefill's included
    stable: dict[int, int] = {}
    states = latent(model, seed, p, scale)[None]
    embeds: torch.Tensor | None = None  # the previous step's, for the positions from the cache length on
    step = 0
    last_input = p + max_tokens - (1 if config.frozen_token == "input" else 2)  # no position past the last token
    while len(frozen) - p < max_tokens:
        start, n = cache.length, states.shape[0]
        mixed_states = states.clone()
        for i in range(n):
            beta = config.state_noise_mixing / ((1 + counter[start + i]) if config.dampened_state_mixer else 1)
            if beta > 0:
                z = model.initial_latent(noise, scale)
                mixed_states[i] = (states[i] * max(1 - beta, 0) ** 0.5 + beta**0.5 * z if config.sqrt_mixer
                                   else (1 - beta) * states[i] + beta * z)
        if embeds is not None and embeds.shape[0] < n:  # a position new last step: its embedding times 1 - ema
            embeds = torch.cat([embeds, torch.zeros(n - embeds.shape[0], embeds.shape[1], dtype=embeds.dtype)])
        logits, z, e = run(model, cache, sequence[start : start + n], start, mixed_states, inner, embeds,
                           config.ema_embeds)
        seen = [sequence[: start + i + 1] for i in range(n)]
        tokens = penalised(logits, seen, repetition_penalty).argmax(-1).tolist()
        for i in range(n):
            counter[start + i] += inner
        for i in range(1, n):
            stable[start + i] = stable.get(start + i, 0) + (tokens[i - 1] == sequence[start + i])
        change = relative(z, states)
        sequence = frozen + tokens
        states, embeds = z, e
        room = config.max_wavefront == 0 or n < config.max_wavefront
        if room and start + n <= last_input:
            fresh = z[-1] if config.continuous_compute else latent(model, seed, start + n, scale)
            states = torch.cat([states, fresh[None]])
            counter.setdefault(start + n, 0)
        if config.freeze_strategy == "fixed" or step > config.max_diffusion_steps:
            k = start + 1 + int(step > config.num_steps // inner)  # frozen tokens' count (input token's rule)
            freeze = k - 1 - start
        else:
            if config.freeze_strategy == "latent-diff":
                passed = (change < config.exit_t).nonzero()
            else:
                passed = torch.tensor([[i] for i in range(n) if stable.get(start + i, 0) > config.num_steps // inner])
            last = int(passed[-1]) if len(passed) else -1
            freeze = last + 1 if config.frozen_token == "prediction" else max(last, 0)
        frozen = sequence[: start + 1 + freeze]
        cache.crop(start + freeze)
        states, embeds = states[freeze:], embeds[freeze:]
        if states.shape[0] == 0:
            states, embeds = latent(model, seed, len(frozen) - 1, scale)[None], None
            counter[len(frozen) - 1] = config.num_steps
        step += 1
    return frozen[p:][:max_tokens]
