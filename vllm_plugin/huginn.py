"""Huginn's samplers (`ar`, `adaptive`, `wavefront`) on vLLM, each request with its own `common.huginn` decoder.

The forward a decoder plans starts at its last committed token, as vLLM's step does: that token then the in-flight
positions (the wavefront's) are the step's scheduled tokens, the rest riding as draft tokens. Just before the
forward, the rows' latents, recurrence counts and mixed embeddings go to the model (`vllm_plugin.raven`); after it,
the decoder digests the rows' logits, latents and embeddings in place of vLLM's sampler and the positions it
freezes are the step's output, their KV kept (`CommitScheduler` rolls back the rest, and a step that freezes
nothing commits nothing). Latents live in the decoders, dropped when vLLM finishes or aborts a request. `logprobs`
are read from the rows each token was chosen from (`HuginnDecoder.picked`). A request's structured output and bad
words are its decoder's grammar (`vllm_plugin.grammars`), masking each row after the tokens before it.

A step the decoder did not plan (a prompt or a prompt chunk, a preempted request's recompute, part of a window
under vLLM's token budget) runs `num_steps` recurrences from the rows' initial latents and commits nothing but a
finished prompt's first token. So a preempted wavefront request goes on from KV recomputed as `ar` computes it.
"""

from dataclasses import dataclass
from typing import Any

import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.huginn.decoder import HuginnDecoder
from parallel_decoding.common.huginn.forward import RecurrentForward, RecurrentOutput, RecurrentRows
from parallel_decoding.vllm_plugin.grammars import Grammars
from parallel_decoding.vllm_plugin.logprobs import logprobs_tensors, processed
from parallel_decoding.vllm_plugin.proposer import PluginProposer, request_sampling


@dataclass
class HuginnRequest:
    decoder: HuginnDecoder
    forward: RecurrentForward | None = None


@dataclass(frozen=True)
class StagedRow:
    """A batch row of the step about to run: its request, its token range, and the forward it carries (None: not
    the decoder's planned one)."""

    req_id: str
    start: int
    end: int
    forward: RecurrentForward | None


class HuginnProposer(PluginProposer):
    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.requests: dict[str, HuginnRequest]
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.staged: list[StagedRow] = []
        self.grammars = Grammars(vllm_config)

    def state(self, runner: Any, req_id: str) -> HuginnRequest:
        if req_id not in self.requests:
            request = runner.requests[req_id]
            limits = Limits(max_tokens=request.sampling_params.max_tokens, context=self.max_model_len - 1)
            sampling = request_sampling(request.sampling_params, adjustments=True)
            decoder = HuginnDecoder(list(request.prompt_token_ids), sampling, limits, self.config, runner.get_model(),
                                    grammar=self.grammars.grammar(request.sampling_params))
            self.requests[req_id] = HuginnRequest(decoder)
        return self.requests[req_id]

    def positions(self, runner: Any, positions: torch.Tensor) -> None:
        """Stage every row's recurrent state on the model for the forward about to run."""
        batch = runner.input_batch
        queries = runner.query_start_loc.np[: batch.num_reqs + 1]
        self.staged, forwards = [], []
        for row, req_id in enumerate(batch.req_ids):
            start, end = int(queries[row]), int(queries[row + 1])
            state, first = self.state(runner, req_id), runner.requests[req_id].num_computed_tokens
            planned = state.forward
            if planned is None or planned.start != first or planned.token_ids.numel() != end - start:
                planned = None
            self.staged.append(StagedRow(req_id, start, end, planned))
            forwards.append(planned or self.unplanned(state.decoder, first, end - start))
        model = runner.get_model()
        padding = positions.shape[0] - int(queries[-1])
        if padding > 0:
            forwards.append(RecurrentForward(torch.zeros(padding, dtype=torch.long), 0,
                                             torch.zeros(padding, model.config.n_embd), 1))
        if forwards:
            model.rows = RecurrentRows.of(forwards)

    def unplanned(self, decoder: HuginnDecoder, start: int, count: int) -> RecurrentForward:
        """`num_steps` recurrences from the rows' initial latents (the engine's input ids are the tokens)."""
        return RecurrentForward(torch.zeros(count, dtype=torch.long), start, decoder.latents(start, count),
                                self.config.num_steps)

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> Any:
        from vllm.v1.outputs import SamplerOutput

        last = runner.get_model().last
        ends = metadata.cu_num_sampled_tokens.tolist() if metadata is not None else range(1, len(self.staged) + 1)
        committed: list[list[int]] = []
        chosen_rows: list[tuple[int, int, int]] = []  # batch row, slot, the logits row its token was chosen from
        first_logit = 0
        for staged, end_logit in zip(self.staged, ends, strict=True):
            state = self.requests[staged.req_id]
            rows = slice(staged.start, staged.end)
            out = RecurrentOutput(last.latents[rows].float().cpu(), logits[first_logit:end_logit].float().cpu(),
                                  last.embeds[rows].float().cpu())
            committed.append(self.commit(runner, staged, state, out))
            if committed[-1] and staged.req_id in runner.input_batch.num_logprobs:
                chosen_rows += [(len(committed) - 1, slot, first_logit + index)
                                for slot, index in enumerate(state.decoder.picked)]
            first_logit = end_logit
        self.staged = []
        width = max(2, *(len(tokens) + 1 for tokens in committed))
        sampled = torch.full((len(committed), width), -1, dtype=torch.int32)
        for row, tokens in enumerate(committed):
            sampled[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        logprobs = None
        if runner.input_batch.num_logprobs:  # the distributions the tokens were chosen from
            mode = runner.model_config.logprobs_mode
            logprobs = logprobs_tensors([processed(logits[index], mode) for *_, index in chosen_rows],
                                        [committed[row][slot] for row, slot, _ in chosen_rows],
                                        [row * width + slot for row, slot, _ in chosen_rows], (len(committed), width),
                                        runner.input_batch.max_num_logprobs, runner.sampler, logits)
        return SamplerOutput(sampled_token_ids=sampled.to(logits.device), logprobs_tensors=logprobs)

    def commit(self, runner: Any, staged: StagedRow, state: HuginnRequest, out: RecurrentOutput) -> list[int]:
        """The tokens the step commits for one request: its planned forward's, or a finished prompt's first."""
        decoder, planned, state.forward = state.decoder, staged.forward, None
        if planned is not None:
            return decoder.apply(planned, out)
        prompt_done = runner.requests[staged.req_id].num_computed_tokens + staged.end - staged.start
        if not decoder.output and prompt_done == len(decoder.prompt):
            return decoder.apply(decoder.plan(), out)
        return []

    def draft(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
              ) -> tuple[list[list[int]], None]:
        scheduled = scheduler_output.num_scheduled_tokens
        drafts: list[list[int]] = []
        for req_id in runner.input_batch.req_ids:
            state = self.requests.get(req_id)
            ready = state is not None and state.decoder.output and not state.decoder.finished and (
                runner.requests[req_id].num_computed_tokens + scheduled.get(req_id, 0) >= state.decoder.cache_len)
            if ready:
                state.forward = state.decoder.plan()
            drafts.append(state.forward.token_ids[1:].tolist() if ready else [])
        return drafts, None
