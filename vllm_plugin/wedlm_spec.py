"""WeDLM-drafted lossless speculation on vLLM: no extra forward, the verify pass carries the mask slots.

Each request keeps a `common.wedlm_spec.WeDLMSpecDecoder`. A step schedules `[seed, drafts, mask x W]`; vLLM's
rejection sampler verifies the drafts and the mask slots alike, a mask slot's proposal being a point mass on the
mask token, so the slot that follows the last accepted draft yields the bonus (greedy: the argmax; sampled: the
residual of a point mass, which is the target distribution itself). The mask rows past the bonus's slot become
the decoder's next drafts, with their proposal probabilities for the sampler.
"""

from dataclasses import dataclass
from typing import Any

import torch

from common.decoder import Limits
from common.wedlm_spec import WeDLMSpecDecoder
from vllm_plugin.proposer import PluginProposer


@dataclass
class SpecRequest:
    decoder: WeDLMSpecDecoder
    slots: torch.Tensor | None = None  # the last verify forward's mask rows past the bonus's slot


class WeDLMSpecProposer(PluginProposer):
    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.requests: dict[str, SpecRequest] = {}
        self.max_model_len: int = vllm_config.model_config.max_model_len

    def forget(self, finished_req_ids: set[str]) -> None:
        super().forget(finished_req_ids)
        for req_id in finished_req_ids:
            self.requests.pop(req_id, None)

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        if metadata is None:
            return
        ends = metadata.cu_num_sampled_tokens.tolist()
        start = 0
        for row, req_id in enumerate(runner.input_batch.req_ids):
            state = self.requests.get(req_id)
            if state is not None and metadata.num_draft_tokens[row]:
                state.slots = logits[start + state.decoder.drafts.numel() + 2 : ends[row]]
            start = ends[row]

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        batch = runner.input_batch
        drafts: list[list[int]] = []
        states: list[SpecRequest | None] = []
        for row, req_id in enumerate(batch.req_ids):
            committed = sampled_token_ids[row]
            if not committed:
                drafts.append([])
                states.append(None)
                continue
            num_tokens = int(batch.num_tokens_no_spec[row])
            state = self.requests.get(req_id)
            if state is None or state.slots is None or state.decoder.num_tokens + len(committed) != num_tokens:
                state = self.start(runner, row, req_id, num_tokens)
            else:
                state.decoder.follow(committed, state.slots.float().cpu())
                state.slots = None
            drafts.append(state.decoder.window_tokens if not state.decoder.finished else [])
            states.append(state)
        return drafts, self.proposals(runner, drafts, states)

    def proposals(self, runner: Any, drafts: list[list[int]], states: list[SpecRequest | None]
                  ) -> torch.Tensor | None:
        """[rows, k, vocab] proposal probabilities when a row samples: the drafts' own, then a point mass on the
        mask token for each mask slot."""
        if all(s is None or s.decoder.sampling.greedy for s in states):
            return None
        k = max(len(tokens) for tokens in drafts)
        vocab = runner.model_config.get_vocab_size()
        probs = torch.zeros(len(drafts), k, vocab)
        for row, (tokens, state) in enumerate(zip(drafts, states, strict=True)):
            if state is None or not tokens:
                continue
            decoder = state.decoder
            m = decoder.drafts.numel()
            if decoder.draft_probs is not None:
                probs[row, :m, : decoder.draft_probs.shape[-1]] = decoder.draft_probs
            probs[row, torch.arange(m, len(tokens)), decoder.config.mask_token_id] = 1.0
        return probs.to(runner.device)

    def start(self, runner: Any, row: int, req_id: str, num_tokens: int) -> SpecRequest:
        """A decoder whose prompt is every token but the last, which it has just committed (no drafts yet)."""
        tokens = runner.input_batch.token_ids_cpu[row, :num_tokens].tolist()
        request = runner.requests[req_id]
        emitted = len(request.output_token_ids)
        sampling, generator = self.request(runner, req_id)
        limits = Limits(max_tokens=request.sampling_params.max_tokens - emitted + 1, context=self.max_model_len - 1)
        decoder = WeDLMSpecDecoder(tokens[:-1], sampling, limits, self.config)
        decoder.generator = generator
        decoder.commit(tokens[-1:])
        self.requests[req_id] = state = SpecRequest(decoder)
        return state
