"""vLLM's scheduler for steps that may commit nothing, reserving KV slots for a draft block written past the
verified tokens where a method needs them."""

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler


class CommitScheduler(Scheduler):
    """vLLM's scheduler, for methods whose step may commit nothing (the bonus token's row included)."""

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """A step that gives a request no token (block diffusion recomputing a preempted request's KV, or part of
        its window; a Huginn position not yet converged) leaves its last token uncomputed: the next window starts
        with it, as after any step."""
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished() and req_id in index and sampled \
                    and len(sampled[index[req_id]]) == 0:
                request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        return outputs


class LookaheadScheduler(CommitScheduler):
    """Reserves k + 1 slots ahead: the draft block `[seed, mask x k]` sits after up to k accepted tokens.

    vLLM reserves none for `custom_class` proposers; without this the draft forward of diffusion
    self-speculation could write KV past the blocks a request owns.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_lookahead_tokens = self.num_spec_tokens + 1


class WindowScheduler(Scheduler):
    """No bonus token per step: a request's drafts are a window, and the step keeps only what the method commits.

    vLLM's scheduler has this mode for diffusion models (it rolls back the uncommitted window and allows a step
    that commits nothing); WeDLM steps need exactly that.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
