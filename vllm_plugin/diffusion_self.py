"""Diffusion self-speculation on vLLM: the target drafts `[seed, mask x k]` bidirectionally over its paged prefix,
with the draft adapter (`draft_adapter`, NLD's LoRA) switched on for that forward only.

The draft window, its width and the draft choice come from `common.diffusion_self`; vLLM's rejection sampler
verifies with the proposal probabilities we hand it, so sampling stays exact.
"""

from contextlib import AbstractContextManager, nullcontext
from itertools import accumulate
from typing import Any

import torch

from parallel_decoding.common.diffusion_self import draft_width, draft_window, propose
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.vllm_plugin.paged_forward import PagedWindow, run_windows
from parallel_decoding.vllm_plugin.proposer import PluginProposer


class DiffusionSelfProposer(PluginProposer):
    lora: LoRA | None = None

    def adapter(self, runner: Any) -> AbstractContextManager:
        """The draft adapter switched on (loaded onto the served model's modules once), or nothing."""
        if not self.config.draft_adapter:
            return nullcontext()
        if self.lora is None:
            self.lora = LoRA(runner.get_model(), self.config.draft_adapter)
        return self.lora.enabled()

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        batch = runner.input_batch
        k = self.config.num_speculative_tokens
        limits = [draft_width(k, state.sampling_params.max_tokens - len(state.output_token_ids))
                  if sampled_token_ids[row] else 0
                  for row, state in enumerate(runner.requests[req_id] for req_id in batch.req_ids)]
        if self.planner is not None and self.planner.plain_again(batch.req_ids, limits):
            self.step_done(scheduler_output)  # the last step was plain for all (nothing verified) and so is this one
            return [[] for _ in batch.req_ids], None
        windows = []
        for row, width in enumerate(self.widths(runner, scheduler_output, sampled_token_ids, limits)):
            if width > 0:
                seed_position = int(batch.num_tokens_no_spec[row]) - 1
                forward = draft_window(sampled_token_ids[row][-1], seed_position, width, self.config)
                windows.append(PagedWindow(row, seed_position, forward))
        drafts: list[list[int]] = [[] for _ in batch.req_ids]
        if not windows:  # a plain AR step: NLD's AR mode
            self.step_done(scheduler_output)
            return drafts, None
        with self.adapter(runner):
            logits = run_windows(runner, windows).float()
        self.step_done(scheduler_output, sum(w.forward.token_ids.numel() for w in windows))
        requests = [self.request(runner, batch.req_ids[w.row]) for w in windows]
        widths = [w.forward.logit_rows.numel() for w in windows]
        if all(sampling.greedy for sampling, _ in requests):
            tokens = propose(logits, self.config.mask_token_id, SamplingParams(), None)[0].tolist()
            for window, chunk in zip(windows, split(tokens, widths), strict=True):
                drafts[window.row] = chunk
            return drafts, None
        probs = torch.zeros(len(batch.req_ids), k, logits.shape[-1], device=logits.device)
        for window, rows, (sampling, generator) in zip(windows, logits.split(widths), requests, strict=True):
            tokens, q = propose(rows.cpu(), self.config.mask_token_id, sampling, generator)
            drafts[window.row] = tokens.tolist()
            if q is not None:  # a greedy row's verification reads no proposal
                probs[window.row, : len(tokens)] = q.to(probs.device)
        return drafts, probs


def split(values: list[int], sizes: list[int]) -> list[list[int]]:
    """`values` cut into consecutive pieces of `sizes`."""
    ends = list(accumulate(sizes))
    return [values[end - size : end] for end, size in zip(ends, sizes, strict=True)]
