"""Jacobi decoding on vLLM: no extra forward, the next drafts are the verify pass's own per-position predictions.

Each request keeps a `common.jacobi.JacobiDecoder`; vLLM verifies its `main_drafts()` with its rejection
sampler, and the decoder follows with the committed tokens and the predictions seen in the verify logits.
"""

from dataclasses import dataclass
from typing import Any

import torch

from common.decoder import Limits
from common.jacobi import JacobiDecoder
from common.sampling import choose
from vllm_plugin.proposer import PluginProposer


@dataclass
class JacobiRequest:
    decoder: JacobiDecoder
    predicted: list[int] | None = None


class JacobiProposer(PluginProposer):
    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.requests: dict[str, JacobiRequest] = {}

    def forget(self, finished_req_ids: set[str]) -> None:
        super().forget(finished_req_ids)
        for req_id in finished_req_ids:
            self.requests.pop(req_id, None)

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        if metadata is None:
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
                    state.predicted = greedy[start:end]
                else:
                    state.predicted = choose(logits[start:end].cpu(), sampling, generator).tolist()
            start = end

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], None]:
        batch = runner.input_batch
        drafts: list[list[int]] = []
        for row, req_id in enumerate(batch.req_ids):
            committed = sampled_token_ids[row]
            if not committed:
                drafts.append([])
                continue
            num_tokens = int(batch.num_tokens_no_spec[row])
            state = self.requests.get(req_id)
            if state is None or state.predicted is None or state.decoder.num_tokens + len(committed) != num_tokens:
                state = self.start(runner, row, req_id, num_tokens)
            else:
                state.decoder.follow(state.predicted, committed)
                state.predicted = None
            drafts.append(state.decoder.main_drafts())
        return drafts, None

    def start(self, runner: Any, row: int, req_id: str, num_tokens: int) -> JacobiRequest:
        """A decoder whose prompt is every token but the last, which opens its first block."""
        tokens = runner.input_batch.token_ids_cpu[row, :num_tokens].tolist()
        request = runner.requests[req_id]
        emitted = len(request.output_token_ids)
        sampling, _ = self.request(runner, req_id)
        limits = Limits(max_tokens=request.sampling_params.max_tokens - emitted + 1)
        decoder = JacobiDecoder(tokens[:-1], sampling, limits, self.config)
        decoder.begin(tokens[-1])
        decoder.commit(tokens[-1:])
        self.requests[req_id] = state = JacobiRequest(decoder)
        return state
