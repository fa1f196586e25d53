"""vLLM's scheduler, reserving KV slots for a draft block written past the verified tokens."""

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler


class LookaheadScheduler(Scheduler):
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
