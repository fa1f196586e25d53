"""Penalties, logit bias and allowed tokens on the logit rows of one forward, each row with its own history: the
request's prompt and committed output, plus the tokens of the forward that the row attends to at logical positions
up to its own and past what is committed (a WeDLM window's fills, a diffusion block's revealed tokens, the chain a
verify row follows), masks excluded. So a slot decided in a window sees penalties from the tokens before it, as AR's
next token does, and a lossless method's verify row gets exactly AR's adjusted distribution.

Each engine's definitions and order (`SamplingParams.rules`), so a lossless method equals that engine's AR.
Both: tokens outside `allowed_token_ids` never chosen, the stop tokens never chosen by a row that predicts one of
the first `min_tokens` output tokens (`Forward.predicted`). vLLM's: `logit_bias` added, then the repetition penalty
over every token seen, prompt included (positive logits divided, negative ones multiplied), then the frequency and
presence penalties (generated tokens only) subtracted. SGLang's: the frequency and presence penalties subtracted,
then the repetition penalty over the generated tokens only, then `logit_bias` added (after its grammar mask, which
the bias cannot lift)."""

import torch

from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.common.window import Forward


def fills(forward: Forward, committed: int, mask_token_id: int | None) -> torch.Tensor:
    """Bool [rows, n]: which of the forward's tokens are in each logit row's history beyond the committed ones."""
    rows = forward.logit_rows
    positions = forward.positions
    counted = forward.visibility()[rows] & (positions[None, :] <= positions[rows][:, None])
    counted &= (positions >= committed)[None, :]
    if mask_token_id is not None:
        counted &= (forward.token_ids != mask_token_id)[None, :]
    return counted


def adjusted(logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int], forward: Forward,
             mask_token_id: int | None = None) -> torch.Tensor:
    """`logits` ([rows, V], the forward's `logit_rows` in order) with the request's adjustments, as float32."""
    logits = logits.float().clone()
    vocab = logits.shape[-1]
    if params.allowed_token_ids:
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[list(params.allowed_token_ids)] = True
        logits[:, ~allowed.to(logits.device)] = float("-inf")
    if params.min_tokens and params.stop_token_ids:
        early = (forward.predicted - len(prompt) < params.min_tokens).to(logits.device)
        logits[early.nonzero()[:, :1], list(params.stop_token_ids)] = float("-inf")
    sglang = params.rules == "sglang"
    if params.logit_bias and not sglang:
        logits = biased(logits, params)
    if params.repetition_penalty != 1 or params.frequency_penalty or params.presence_penalty:
        counted = fills(forward, len(prompt) + len(output), mask_token_id)
        generated = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab].float()
        generated = generated.repeat(len(counted), 1).scatter_add_(
            1, forward.token_ids.expand_as(counted), counted.float()).to(logits.device)
        subtracted = params.frequency_penalty * generated + params.presence_penalty * (generated > 0).float()
        if sglang:
            logits = logits - subtracted
        if params.repetition_penalty != 1:
            seen = generated > 0
            if not sglang:
                seen |= (torch.bincount(torch.tensor(prompt, dtype=torch.long), minlength=vocab)[:vocab]
                         > 0).to(logits.device)[None, :]
            penalised = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
            logits = torch.where(seen, penalised, logits)
        if not sglang:
            logits = logits - subtracted
    return biased(logits, params) if params.logit_bias and sglang else logits


def biased(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`logits` with the request's `logit_bias` added."""
    tokens, biases = zip(*params.logit_bias, strict=True)
    logits[:, list(tokens)] += torch.tensor(biases, device=logits.device)
    return logits
