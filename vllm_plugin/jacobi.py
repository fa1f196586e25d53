"""Jacobi decoding on vLLM: no extra forward, the next drafts are the verify pass's own per-position predictions.

Each request keeps a `common.jacobi.JacobiDecoder`; vLLM verifies its `main_drafts()` with its rejection
sampler, and the decoder follows with the committed tokens and the predictions seen in the verify logits.
"""

from typing import Any

import torch

from parallel_decoding.common.jacobi import JacobiDecoder
from parallel_decoding.common.sampling import choose
from parallel_decoding.vllm_plugin.following import FollowingProposer


class JacobiProposer(FollowingProposer):
    decoder_class = JacobiDecoder
    follows_plain_steps = True

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        """Each verified request's per-position predictions: the greedy argmax, or a sample (none in a step where no
        request drafted: the planner's plain AR step shows a decoder only its token)."""
        if metadata is None or not metadata.max_spec_len:
            return
        ends = metadata.cu_num_sampled_tokens.tolist()
        greedy = logits.argmax(-1).tolist()
        start = 0
        for row, req_id in enumerate(runner.input_batch.req_ids):
            end = ends[row]
            state = self.requests.get(req_id)
            if state is not None and metadata.num_draft_tokens[row]:
                sampling, generator = self.request(runner, req_id)
                if sampling.greedy:
                    state.seen = greedy[start:end]
                else:
                    state.seen = choose(logits[start:end].cpu(), sampling, generator).tolist()
            start = end

    def follow(self, decoder: JacobiDecoder, committed: list[int], seen: list[int]) -> None:
        decoder.follow(seen, committed)

    def drafts_of(self, decoder: JacobiDecoder) -> list[int]:
        return decoder.main_drafts()
