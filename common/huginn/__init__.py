"""Huginn's samplers for recurrent-depth models (seed 000), per request, with their reference runner:
`config` (settings), `forward` (one recurrent forward), `decoder` (a request's state machine), `reference`
(the reference runner).

Every forward is a `RecurrentForward`: rows at consecutive positions after the cached prefix, each with a latent;
the prelude embeds the rows, the core runs `inner` recurrences on their latents, the coda gives logits. Samplers:

- `ar`: one token per forward, `num_steps` recurrences from a fresh latent.
- `adaptive`: one recurrence per forward until the latent's relative change falls below `exit_threshold` (at most
  `num_steps`), then the token.
- `speculative`: `lookahead_for_draft` tokens drafted one by one with `draft_steps` recurrences, verified in one
  forward with `num_steps` (greedy match, or rejection sampling against the drafts' own distributions): lossless
  against `ar` on the `full` cache, where a parallel forward and a token-by-token one see the same KV.
- `wavefront`: the diffusion-forcing sampler (Algorithm 2) as upstream's `generate_diffusion_style` runs it, under
  its keyword names: every in-flight position advances `inner_recurrence` recurrences per step with its latent
  kept across steps and its input token the previous position's latest prediction; a position enters each step
  (up to `max_wavefront`, 0: no bound); input embeddings with momentum `ema_embeds` (a new position's scaled by
  1 - `ema_embeds`, as upstream's are); state noise `state_noise_mixing` / (1 + the position's recurrences)
  (`dampened_state_mixer`, `sqrt_mixer`); a new position starts from a fresh latent or its predecessor's
  (`continuous_compute`). The positions up to the *last* one that passed `freeze_strategy`'s test freeze (no
  per-position cap): `latent-diff` (relative latent change below `exit_t`), `token-stability`, or `fixed` (the
  first position each step after num_steps // inner_recurrence steps). Their KV stays and their predictions
  are committed; the last one stays in flight with its input token frozen (upstream's rule, `frozen_token`
  `input`), or freezes with its prediction (the paper's text, `frozen_token` `prediction`). Past
  `max_diffusion_steps` steps, where upstream stops, the first position freezes every step. Refused by name:
  `headway` > 1, `full_prefill` false, the `latent-acceleration` strategies and the analysis tablets.

Initial latents are drawn per position from the request's seed, so a position starts from the same latent in
every sampler and every batch; a greedy request without a seed uses `GREEDY_LATENT_SEED`, so that temperature 0
gives the same text on every call (upstream draws fresh latents each time). The settings carry upstream
`generate()`'s keyword names.
"""
