"""Methods whose own rule commits tokens (WeDLM windows, NLD block diffusion) on vLLM's spec-decode data path.

Each request keeps its `common/` decoder. The forward the decoder plans next rides on vLLM's scheduled
draft tokens (its RoPE positions rewritten to the plan's logical ones); the decoder reads that forward's
logits in place of vLLM's sampler and its committed tokens are the step's output. The decoders sample with
their own seeded generators, so a seeded request gives the tokens `common.generate` gives.

A request's structured output and bad words are its decoder's grammar (`vllm_plugin.grammars`). A request vLLM
preempts keeps its decoder: the steps that recompute its KV commit nothing, and a step that schedules only part of a
window (vLLM's token budget) commits nothing and the window is planned again.
"""

from dataclasses import dataclass
from typing import Any

import torch

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.methods import make_decoder
from parallel_decoding.common.row_stats import apply_rows, member_rows, rows_of
from parallel_decoding.common.window import Forward, causal_forward
from parallel_decoding.vllm_plugin.grammars import Grammars
from parallel_decoding.vllm_plugin.logprobs import CommittedStep, committed_logprobs
from parallel_decoding.vllm_plugin.proposer import PluginProposer, request_sampling


@dataclass
class CommitRequest:
    """A request's decoder, the forward planned for the next step, tokens settled ahead of the step that emits
    them (`pending`), and, when it asks for logprobs, the row carried for its next token (`vllm_plugin.logprobs`)."""

    decoder: Decoder
    forward: Forward | None = None
    pending: list[int] | None = None
    carried: torch.Tensor | None = None
    idle: bool = False  # vLLM's own sampler takes its plain AR steps; its decoder is paused (`CommitProposer.pause`)


class CommitProposer(PluginProposer):
    """The shared engine side; subclasses say what to draft for the decoder's next forward."""

    # Positions vLLM's scheduler keeps free past a request's scheduled tokens (its sampled token per step).
    context_margin = 1

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.requests: dict[str, CommitRequest]
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.grammars = Grammars(vllm_config)

    def start(self, runner: Any, req_id: str) -> CommitRequest:
        """A decoder for a request whose prompt has just been prefilled, seeded as `common.generate` seeds."""
        request = runner.requests[req_id]
        sampling = request_sampling(request.sampling_params, adjustments=True)
        limits = Limits(max_tokens=request.sampling_params.max_tokens, context=self.max_model_len - self.context_margin)
        decoder = make_decoder(self.method, self.config, list(request.prompt_token_ids), sampling, limits)
        decoder.grammar = self.grammars.grammar(request.sampling_params)
        self.requests[req_id] = state = CommitRequest(decoder, decoder.next_forward())
        return state

    def pause(self, runner: Any, req_id: str, state: CommitRequest) -> bool:
        """Pause the decoder of a request its plan holds at no draft, where vLLM's sampler commits what it would:
        greedy (the same argmax), nothing adjusting its rows (penalties, biases, a grammar), no logprobs asked;
        whether it is paused. A step in which every request is paused is then vLLM's AR step, with no digest and no
        planned forward."""
        decoder = state.decoder
        if (state.idle or not decoder.sampling.greedy or decoder.reads_logits or state.pending is not None
                or req_id in runner.input_batch.num_logprobs):
            return state.idle
        decoder.pause()
        state.idle, state.forward = True, None
        return True

    def wake(self, runner: Any, row: int, state: CommitRequest) -> None:
        """A paused request's decoder takes the tokens vLLM's sampler committed since it paused."""
        self.catch_up(runner, row, state.decoder)
        state.idle = False

    def positions(self, runner: Any, positions: torch.Tensor) -> None:
        """The scheduled windows' logical positions in place of vLLM's, written in one copy."""
        if self.steady(runner.input_batch.req_ids):
            return
        queries = runner.query_start_loc.np[: runner.input_batch.num_reqs + 1]
        starts, placed = [], []
        for row, req_id in enumerate(runner.input_batch.req_ids):
            state, end = self.requests.get(req_id), int(queries[row + 1])
            if state is not None and self.scheduled_window(runner, req_id, state, end - int(queries[row])):
                forward = state.forward
                starts.append(end - forward.num_tokens)
                placed.append(forward.positions)
        if placed:
            index, _ = member_rows(starts, [len(p) for p in placed])
            positions[index.to(positions.device)] = torch.cat(placed).to(positions.device, positions.dtype)

    @staticmethod
    def scheduled_window(runner: Any, req_id: str, state: CommitRequest, scheduled: int) -> bool:
        """Whether the step forwards exactly the request's planned window: not the recompute of a preempted
        request's KV, nor part of a window (vLLM's token budget), both of which commit nothing."""
        request, forward = runner.requests[req_id], state.forward
        return (state.pending is None and forward is not None and forward.num_tokens == scheduled
                and request.num_computed_tokens == state.decoder.cache_len)

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> Any:
        """The step's committed tokens: a request's pending ones, or what its decoder digests from the forward.

        vLLM computes logits for a request's last rows: all of a window's rows (WeDLM's, after one row it does not
        own), the block's rows, or a prompt's last row; the planned forward's rows end with them.
        """
        from vllm.v1.outputs import SamplerOutput

        batch = runner.input_batch
        if self.steady(batch.req_ids):
            return None  # vLLM's own AR step
        states = [self.requests.get(req_id) for req_id in batch.req_ids]
        if all(state is not None and state.idle for state in states):
            return None
        ends = metadata.cu_num_sampled_tokens.tolist() if metadata is not None else range(1, batch.num_reqs + 1)
        queries = runner.query_start_loc.np[: batch.num_reqs + 1]
        committed: list[list[int]] = [[] for _ in batch.req_ids]
        digesting: list[tuple[int, Decoder, torch.Tensor]] = []  # batch row, decoder, its rows of `logits`
        reporting: dict[int, tuple[CommittedStep, CommitRequest]] = {}  # batch rows asking for logprobs
        start = 0
        for row, (req_id, end, state) in enumerate(zip(batch.req_ids, ends, states, strict=True)):
            scheduled = int(queries[row + 1] - queries[row])
            request = runner.requests[req_id]
            if state is not None and state.idle:  # beside requests that draft: its plain step digested with theirs
                self.wake(runner, row, state)
                state.forward = state.decoder.next_forward()
            if state is None:
                if request.num_computed_tokens + scheduled >= len(request.prompt_token_ids) and end - start == 1:
                    state = self.start(runner, req_id)
            elif state.pending is None and not self.scheduled_window(runner, req_id, state, scheduled):
                state = None  # the decoder goes on with the window planned again
            if state is not None and state.pending is not None:
                decoder, tokens = state.decoder, state.pending
                first = decoder.num_tokens - len(tokens)  # scheduled causally after the token before them
                forward = causal_forward(decoder.tokens[first - 1 : first + len(tokens)], first - 1, [])
                committed[row], state.pending, state.forward = tokens, None, None
            elif state is not None:
                forward, state.forward = state.forward, None
                digesting.append((row, state.decoder, forward.logit_rows + (end - forward.num_tokens)))
            if state is not None and req_id in batch.num_logprobs:
                reporting[row] = (CommittedStep(forward, committed[row], state.decoder.tokens, start, end), state)
            start = end
        if digesting:
            rows = [rows for _, _, rows in digesting]
            outcomes = apply_rows([decoder for _, decoder, _ in digesting],
                                  rows_of(logits, torch.cat(rows)), [len(r) for r in rows],
                                  margins=False)
            for (row, decoder, _), outcome in zip(digesting, outcomes, strict=True):
                committed[row] = outcome.committed
                if row in reporting:
                    reporting[row][0].committed, reporting[row][0].tokens = outcome.committed, decoder.tokens
        width = max(2, *(len(tokens) + 1 for tokens in committed))
        out = torch.tensor([tokens + [-1] * (width - len(tokens)) for tokens in committed], dtype=torch.int32)
        logprobs = None
        if reporting:
            logprobs = committed_logprobs(logits, reporting, tuple(out.shape), batch.max_num_logprobs,
                                          runner.model_config.logprobs_mode, runner.sampler)
        return SamplerOutput(sampled_token_ids=out.to(logits.device), logprobs_tensors=logprobs)

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], None]:
        if self.steady_step(runner, scheduler_output, sampled_token_ids):
            return [[] for _ in sampled_token_ids], None
        scheduled = scheduler_output.num_scheduled_tokens
        planned = [
            (row, state)
            for row, req_id in enumerate(runner.input_batch.req_ids)
            if (state := self.requests.get(req_id)) is not None and not state.decoder.finished
            and runner.requests[req_id].num_computed_tokens + scheduled.get(req_id, 0) >= state.decoder.cache_len
        ]  # a resumed request plans once the KV its decoder counts as cached is back
        drafts: list[list[int]] = [[] for _ in runner.input_batch.req_ids]
        paused = len(planned) == len(drafts) and all(state.idle for _, state in planned)
        for row, tokens in self.plan(runner, planned).items():
            drafts[row] = tokens
        self.hold(runner.input_batch.req_ids, paused and all(state.idle for _, state in planned))
        self.step_done(scheduler_output)
        return drafts, None

    def plan(self, runner: Any, planned: list[tuple[int, CommitRequest]]) -> dict[int, list[int]]:
        """Set each request's next `forward` and return the draft tokens vLLM must schedule, by batch row."""
        raise NotImplementedError
