"""vLLM's scheduler for our methods: each step's drafts taken from the step's output, for steps that may commit
nothing, reserving KV slots for a draft block written past the verified tokens where a method needs them."""

import functools
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

CARRIED = "parallel_decoding_drafts"  # the attribute of a step's ModelRunnerOutput that carries its drafts
WAITING = "parallel_decoding_waiting"  # the attribute of a step's SchedulerOutput: whether requests wait after it


class CarryingScheduler(Scheduler):
    """vLLM's scheduler, taking the drafts for the next step from this step's output, where our worker carries them
    (`runner_hooks`), instead of the engine core asking the worker for them in a call of their own after every step
    (`take_draft_token_ids`, one more round trip between the two processes a step: on CPU 12-15% of a tiny model's
    step at batch 8, docs/adaptive-widths.md)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.carried: tuple[Any] | None = None  # (the step's DraftTokenIds or None,) once a step's output had them
        take_carried_drafts()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's step, telling the worker whether requests still wait for a place in it (`WAITING`; the width
        planner's `others_wait`)."""
        output = super().schedule(*args, **kwargs)
        setattr(output, WAITING, self.get_request_counts()[1] > 0)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.carried = (getattr(model_runner_output, CARRIED),) if hasattr(model_runner_output, CARRIED) else None
        return super().update_from_output(scheduler_output, model_runner_output)


def take_carried_drafts() -> None:
    """Wrap `EngineCore.post_step` (in the engine core's process, once) to hand the scheduler the drafts its last
    step's output carried; where it carried none (another scheduler, a step without requests, vLLM's pipelined
    batch queue), vLLM asks the worker as before."""
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.post_step, "takes_carried_drafts", False):
        return
    post_step = EngineCore.post_step

    @functools.wraps(post_step)
    def post_step_carried(self: Any, model_executed: bool) -> None:
        carried = getattr(self.scheduler, "carried", None)
        if carried is None or self.batch_queue is not None:
            return post_step(self, model_executed)
        self.scheduler.carried = None
        drafts = carried[0]
        # None: no request drafted (a plain AR step; the worker carries none, `runner_hooks`), and each scheduled
        # request's drafts were emptied as it was scheduled.
        if model_executed and self.check_for_draft_tokens and not self.async_scheduling and drafts is not None:
            self.scheduler.update_draft_token_ids(drafts)
        return None

    post_step_carried.takes_carried_drafts = True  # type: ignore[attr-defined]
    EngineCore.post_step = post_step_carried


class CommitScheduler(CarryingScheduler):
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


class WindowScheduler(CarryingScheduler):
    """No bonus token per step: a request's drafts are a window, and the step keeps only what the method commits.

    vLLM's scheduler has this mode for diffusion models (it rolls back the uncommitted window and allows a step
    that commits nothing); WeDLM steps need exactly that.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_sampled_tokens_per_step = 0
