"""The runner hooks our proposers need, installed only in a worker whose proposer is one of ours.

vLLM's `custom_class` proposer sees neither the model runner, nor the step's logits, nor its positions. These
wrappers hand them to a `Hooked` proposer and pass straight through for any other drafter, so an engine in the
same process that uses another method behaves exactly as without the plugin.
"""

import functools
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

_installed = False


class Hooked:
    """What the hooks call on a proposer of ours (`vllm_plugin.proposer.PluginProposer`): `draft` after each
    step's bookkeeping, `adjust_targets` and `before_sample` with the step's logits, `positions` and `attending`
    around its forward,
    `forget` with the requests vLLM finished."""

    def draft(
        self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Draft tokens per batch row, and the proposal probabilities [rows, k, vocab] when any row samples."""
        raise NotImplementedError

    def adjust_targets(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        """Adjust, in place, the step's logits (rows laid out by `metadata`) before anything reads them."""

    def before_sample(self, runner: Any, logits: torch.Tensor, metadata: Any) -> Any:
        """See the step's logits (rows laid out by `metadata`, None without drafts) before vLLM samples.

        Return None to let vLLM's sampler and rejection sampler decide, or a `SamplerOutput` holding the tokens
        this step commits per request (methods whose commit rule is not rejection sampling).
        """
        return None

    def positions(self, runner: Any, positions: torch.Tensor) -> None:
        """Rewrite, in place, the RoPE positions of the step about to run (methods whose windows reorder)."""

    def attending(self, runner: Any) -> AbstractContextManager:
        """What the attention layers do beyond the engine's causal pass while the step runs (methods whose
        windows need a structured mask); nothing by default."""
        return nullcontext()

    def forget(self, finished_req_ids: set[str]) -> None:
        """Drop the state of requests vLLM has finished or aborted."""

    def begin_step(self, runner: Any, scheduler_output: Any) -> None:
        """A step starts (before the runner takes in its scheduler output)."""


def install() -> None:
    """Wrap `GPUModelRunner.propose_draft_token_ids`, `_input_fits_in_drafter`, `_update_states`, `_prepare_inputs`,
    `_sample`, `sample_tokens` and `_model_forward` (the CPU runner inherits them); idempotent."""
    global _installed
    if _installed:
        return
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from parallel_decoding.vllm_plugin.scheduler import CARRIED

    propose_draft_token_ids = GPUModelRunner.propose_draft_token_ids
    input_fits_in_drafter = GPUModelRunner._input_fits_in_drafter
    update_states = GPUModelRunner._update_states
    prepare_inputs = GPUModelRunner._prepare_inputs
    sample = GPUModelRunner._sample
    sample_tokens = GPUModelRunner.sample_tokens
    model_forward = GPUModelRunner._model_forward

    @functools.wraps(propose_draft_token_ids)
    def propose_with_runner(self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any):
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, Hooked):
            return propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        drafts, probs = drafter.draft(self, scheduler_output, sampled_token_ids)
        self._draft_probs = probs
        self._draft_prob_req_ids = None if probs is None else list(self.input_batch.req_ids)
        return drafts

    @functools.wraps(update_states)
    def update_states_forgetting(self: Any, scheduler_output: Any) -> Any:
        """Drop the plugin's state of finished and aborted requests in every step, also the empty one vLLM runs
        only to announce them."""
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, Hooked):
            drafter.begin_step(self, scheduler_output)
            drafter.forget(scheduler_output.finished_req_ids)
        return update_states(self, scheduler_output)

    @functools.wraps(prepare_inputs)
    def prepare_inputs_plainly(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        """A step in which no request verifies a draft (the width planner's plain AR step) is prepared as vLLM
        prepares a step without speculation: vLLM 0.32 builds speculative metadata over zero drafts in every step
        (for the state offsets of recurrent backends, which a hybrid model keeps), 0.1-0.2 ms of a tiny model's 4 ms
        step on CPU. The step's rows and logits are the same either way; `sample_committed` reads `None` as no
        drafts."""
        if (not isinstance(getattr(self, "drafter", None), Hooked) or self.model_config.is_hybrid
                or any(scheduler_output.scheduled_spec_decode_tokens.values())):
            return prepare_inputs(self, scheduler_output, *args, **kwargs)
        speculative_config, self.speculative_config = self.speculative_config, None
        try:
            return prepare_inputs(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = speculative_config

    @functools.wraps(input_fits_in_drafter)
    def fits_our_drafter(self: Any, common_attn_metadata: Any) -> bool:
        """vLLM skips drafting for the whole batch (and schedules zeros) once its longest request is within
        `num_speculative_tokens` of the model length; our proposers keep each request's windows inside it."""
        if isinstance(getattr(self, "drafter", None), Hooked):
            return True
        return input_fits_in_drafter(self, common_attn_metadata)

    @functools.wraps(sample)
    def sample_committed(self: Any, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, Hooked) and logits is not None:
            drafter.adjust_targets(self, logits, spec_decode_metadata)
            output = drafter.before_sample(self, logits, spec_decode_metadata)
            if output is not None:
                return output
            if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
                # no request drafted (the width planner's plain AR step): vLLM's own sampler, as without
                # speculation, not its rejection sampler over no drafts (a copy of every logit row besides)
                return sample(self, logits, None)
        return sample(self, logits, spec_decode_metadata)

    @functools.wraps(sample_tokens)
    def sample_tokens_sparing_cpu_generators(self: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM rewinds the generator of a seeded request whose sampled token it discards (a partial prefill, or a
        partial window of ours under load) by moving its philox offset, which a CPU generator does not have: the
        engine dies ("CPU Generator does not use offset"). Such a request samples this step without its CPU
        generator, which stays as it was: the rewind's effect. The step's output carries the drafts for the next
        step (`scheduler.CarryingScheduler` takes them there instead of asking for them)."""
        if not isinstance(getattr(self, "drafter", None), Hooked):
            return sample_tokens(self, *args, **kwargs)
        generators = self.input_batch.generators
        discarded = self.discard_request_mask.np[: self.input_batch.num_reqs].nonzero()[0].tolist()
        spared = {i: generators.pop(i) for i in discarded if i in generators and generators[i].device.type == "cpu"}
        try:
            output = sample_tokens(self, *args, **kwargs)
        finally:
            generators.update(spared)
        if isinstance(output, ModelRunnerOutput) and output is not EMPTY_MODEL_RUNNER_OUTPUT and output.req_ids:
            drafts = self.take_draft_token_ids()  # our scheduler takes them from here; None where none drafted
            setattr(output, CARRIED, drafts if drafts is not None and any(drafts.draft_token_ids) else None)
        return output

    @functools.wraps(model_forward)
    def model_forward_positioned(self: Any, input_ids: Any = None, positions: Any = None, *args: Any, **kwargs: Any):
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, Hooked) or positions is None:
            return model_forward(self, input_ids, positions, *args, **kwargs)
        drafter.positions(self, positions)
        with drafter.attending(self):
            return model_forward(self, input_ids, positions, *args, **kwargs)

    GPUModelRunner.propose_draft_token_ids = propose_with_runner
    GPUModelRunner._input_fits_in_drafter = fits_our_drafter
    GPUModelRunner._update_states = update_states_forgetting
    GPUModelRunner._prepare_inputs = prepare_inputs_plainly
    GPUModelRunner._sample = sample_committed
    GPUModelRunner.sample_tokens = sample_tokens_sparing_cpu_generators
    GPUModelRunner._model_forward = model_forward_positioned
    _installed = True
