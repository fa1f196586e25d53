"""`logprobs` for the methods whose own rule commits (in place of vLLM's sampler): AR's log-probabilities of the
committed tokens, read from the step's own logit rows that `common.logprob_rows` names, in vLLM's `LogprobsTensors`
layout (one row per output slot), so vLLM's output path reports them as for AR decoding. No extra forward.

vLLM's logits are raw here (our decoders replace its sampler), so the `raw_logprobs` and `raw_logits` modes are
served; the processed modes are refused at startup (`vllm_plugin.config`).
"""

from dataclasses import dataclass
from typing import Any

import torch

from parallel_decoding.common.logprob_rows import logprob_rows
from parallel_decoding.common.window import Forward

RAW_MODES = ("raw_logprobs", "raw_logits")


@dataclass
class CommittedStep:
    """A request's part of the step: the forward that committed `committed` (its logit rows end at `end` in the
    step's logits, none before `start`), and the request's tokens after them."""

    forward: Forward
    committed: list[int]
    tokens: list[int]
    start: int
    end: int

    def row(self, logits: torch.Tensor, index: int | None, mode: str) -> torch.Tensor | None:
        """The forward's row `index` of the step's logits in `mode` (None: not among the request's rows)."""
        at = None if index is None else self.end - self.forward.num_tokens + index
        return None if at is None or at < self.start else processed(logits[at], mode)


def processed(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """Rows as vLLM's sampler reports them in `mode`."""
    return logits.log_softmax(-1, dtype=torch.float32) if mode == "raw_logprobs" else logits.float()


def committed_logprobs(logits: torch.Tensor, steps: dict[int, tuple[CommittedStep, Any]], shape: tuple[int, int],
                       num_logprobs: int, mode: str, sampler: Any) -> Any:
    """vLLM's `LogprobsTensors` for an output of `shape` (requests x slots): for each batch row in `steps` (its
    committed step and its per-request state, whose `carried` row it reads and updates), its committed tokens'
    logprobs and top `num_logprobs`; the other slots are filler vLLM drops (invalid tokens, or requests that did
    not ask). A row missing from the step (never, for our methods) reports -inf."""
    slots, rows, tokens = [], [], []
    for row, (step, state) in steps.items():
        count = len(step.committed)
        named = logprob_rows(step.forward, step.tokens, len(step.tokens) - count, count)
        for j, (index, token) in enumerate(zip(named.rows, step.committed, strict=True)):
            found = state.carried if index is None and j == 0 else step.row(logits, index, mode)
            rows.append(found if found is not None else torch.full_like(logits[0], float("-inf"), dtype=torch.float32))
            slots.append(row * shape[1] + j)
            tokens.append(token)
        following = step.row(logits, named.next_row, mode)
        if following is not None or count:
            state.carried = following
    return logprobs_tensors(rows, tokens, slots, shape, num_logprobs, sampler, logits)


def logprobs_tensors(rows: list[torch.Tensor], tokens: list[int], slots: list[int], shape: tuple[int, int],
                     num_logprobs: int, sampler: Any, logits: torch.Tensor) -> Any:
    """vLLM's `LogprobsTensors` for an output of `shape` (requests x slots) whose flat slot `slots[i]` holds
    `tokens[i]`, predicted by `rows[i]` (processed as vLLM's mode asks); the other slots are filler vLLM drops
    (`logits`: the step's, for a filler row and the device)."""
    from vllm.v1.outputs import LogprobsTensors

    if not rows:  # nothing committed: every slot is filler
        rows, tokens, slots = [logits[0].float()], [0], []
    gathered = sampler.gather_logprobs(torch.stack(rows), num_logprobs,
                                       torch.tensor(tokens, dtype=torch.int64, device=logits.device))
    index = torch.tensor(slots, dtype=torch.int64, device=logits.device)
    out = []
    for part in gathered[:3]:
        full = part.new_zeros((shape[0] * shape[1], *part.shape[1:]))
        full[index] = part[: len(slots)]
        out.append(full)
    return LogprobsTensors(*out)
