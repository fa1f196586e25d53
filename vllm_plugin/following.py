"""Proposers whose per-request `common/` decoder follows vLLM's verification (Jacobi, WeDLM-drafted speculation):
the decoder's drafts are verified by vLLM's rejection sampler, then it follows the committed tokens and what the
verify forward showed it (`seen`, taken in `before_sample`). A request it lost track of (its first step, or after
a preemption) gets a decoder resumed from its tokens so far. Where the method adapts its widths, the planner's
leading drafts are verified; the decoder follows whatever prefix was.
"""

from dataclasses import dataclass
from typing import Any

import torch

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.vllm_plugin.proposer import PluginProposer


@dataclass
class FollowedRequest:
    decoder: Any
    seen: Any = None  # what the last verify forward showed the decoder (None: nothing since it was resumed)
    idle: bool = False  # held at no draft: its plain AR steps go unfollowed until it drafts again (`wake`)


class FollowingProposer(PluginProposer):
    decoder_class: type[Decoder]
    # Whether the decoder can follow a step that verified no draft from its committed token alone (else it resumes).
    follows_plain_steps = False

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.requests: dict[str, FollowedRequest]
        self.max_model_len: int = vllm_config.model_config.max_model_len

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        batch = runner.input_batch
        if self.steady_step(runner, scheduler_output, sampled_token_ids):
            return [[] for _ in sampled_token_ids], None
        drafts: list[list[int]] = []
        states: list[FollowedRequest | None] = []
        iterated: list[bool] = []  # per row: whether the drafts this step verified were (`Decoder.iterated`)
        for row, req_id in enumerate(batch.req_ids):
            committed = sampled_token_ids[row]
            state = self.requests.get(req_id)
            iterated.append(state is None or state.decoder.iterated)
            if not committed:
                drafts.append([])
                states.append(None)
                continue
            num_tokens = int(batch.num_tokens_no_spec[row])
            if state is not None and state.idle and len(committed) == 1:
                drafts.append([])
                states.append(state)
                continue
            if state is None or state.decoder.num_tokens + len(committed) != num_tokens or (
                    state.seen is None and not (self.follows_plain_steps and len(committed) == 1)):
                state = self.resume(runner, row, req_id, num_tokens)
            else:  # no `seen` after a step without drafts (a plain AR step): the committed token is all it showed
                self.follow(state.decoder, committed, committed if state.seen is None else state.seen)
                state.seen = None
            drafts.append([] if state.decoder.finished else self.drafts_of(state.decoder))
            states.append(state)
        paused = [state is not None and state.idle for state in states]
        drafts = self.capped(runner, scheduler_output, sampled_token_ids, drafts, states, iterated)
        self.hold(batch.req_ids, all(paused) and all(state.idle for state in states))
        self.step_done(scheduler_output)
        return drafts, self.proposals(runner, drafts, states)

    def capped(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]], drafts: list[list[int]],
               states: list[FollowedRequest | None], iterated: list[bool]) -> list[list[int]]:
        """The drafts vLLM schedules: each request's leading ones, as many as the planner gives it (`widths`, a
        paused request's limit its configured most); a request held at no draft pauses, a paused one given drafts
        wakes."""
        if self.planner is None:
            return drafts
        limits = [state.decoder.most_drafts if state is not None and state.idle else len(d)
                  for d, state in zip(drafts, states, strict=True)]
        widths = self.widths(runner, scheduler_output, sampled_token_ids, limits, iterated)
        for row, (state, width) in enumerate(zip(states, widths, strict=True)):
            if state is not None and not state.decoder.finished:
                woken = state.idle  # its drafts are the decoder's once it has caught up
                drafting = self.drafts_again(runner, row, state, width)
                drafts[row] = (self.drafts_of(state.decoder) if woken else drafts[row])[:width] if drafting else []
        return drafts

    def drafts_again(self, runner: Any, row: int, state: FollowedRequest, width: int) -> bool:
        """Whether a request drafts this step: one the planner holds at no draft pauses, a paused one given drafts
        wakes."""
        if width == 0:
            self.pause(state)
            return False
        if state.idle:
            self.wake(runner, row, state)
        return True

    @staticmethod
    def pause(state: FollowedRequest) -> None:
        """A request the planner holds at no draft: its decoder follows none of the plain AR steps that come (a
        plain step shows it nothing but its token) until it drafts again."""
        if not state.idle:
            state.decoder.pause()
            state.idle = True

    def wake(self, runner: Any, row: int, state: FollowedRequest) -> None:
        """A paused request's decoder takes the tokens committed since it paused."""
        self.catch_up(runner, row, state.decoder)
        state.idle = False

    def resume(self, runner: Any, row: int, req_id: str, num_tokens: int) -> FollowedRequest:
        """A decoder over the request's tokens so far, drawing with the request's own generator."""
        tokens = runner.input_batch.token_ids_cpu[row, :num_tokens].tolist()
        request = runner.requests[req_id]
        sampling, generator = self.request(runner, req_id)
        limits = Limits(max_tokens=request.sampling_params.max_tokens - len(request.output_token_ids) + 1,
                        context=self.max_model_len - 1)
        decoder = self.decoder_class.resume(tokens, sampling, limits, self.config, generator)
        self.requests[req_id] = state = FollowedRequest(decoder)
        return state

    def follow(self, decoder: Any, committed: list[int], seen: Any) -> None:
        raise NotImplementedError

    def drafts_of(self, decoder: Any) -> list[int]:
        raise NotImplementedError

    def proposals(self, runner: Any, drafts: list[list[int]], states: list[FollowedRequest | None]
                  ) -> torch.Tensor | None:
        """[rows, k, vocab] proposal probabilities for vLLM's rejection sampler when a row samples, else None."""
        return None
