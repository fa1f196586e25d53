"""Wall-clock split of SGLang's decode steps (model forwards, the rest of running the batch, scheduling and result
processing) for `scripts.profile_step --engine sglang`. Installed only in a process where `PD_STEP_TIMES` names a
file; the totals are rewritten there after each step, since a scheduler process is killed rather than exited."""

import json
import os
import time
from collections import Counter
from typing import Any

ENV = "PD_STEP_TIMES"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"


class StepTimes:
    """Seconds per part and counts, summed over the decode steps that ran a batch (prefill steps only counted)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.totals: Counter = Counter()
        self.step: Counter = Counter()  # the step under way

    def timed(self, part: str, rows: bool = False, ran: bool = False, last: bool = False) -> Any:
        """An AROUND hook adding its call's seconds to `part`; `rows`: count its forward batch's rows (and the
        forward); `ran`: only
        calls that returned a batch to run (the scheduler asks in its idle loop too); `last`: the call ends a step,
        whose batch (its first argument) says whether it decoded."""

        def around(original: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            seconds = time.perf_counter() - start
            if ran and getattr(result, "batch_to_run", None) is None:
                return result
            self.step[part] += seconds
            if rows:
                batch = kwargs.get("forward_batch", args[1] if len(args) > 1 else None)
                self.step["rows"] += 0 if batch is None else batch.input_ids.numel()
                self.step["forwards"] += 1
            if last:
                batch = kwargs.get("batch", args[1] if len(args) > 1 else None)
                if batch.forward_mode.is_decode():
                    self.totals.update(self.step)
                    self.totals["steps"] += 1
                else:
                    self.totals["prefill_steps"] += 1
                self.step.clear()
                self.write()
            return result

        return around

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as out:
            json.dump(dict(self.totals), out)
        os.replace(tmp, self.path)


def install() -> None:
    """Register the timers with SGLang's hook registry when `PD_STEP_TIMES` is set; nothing otherwise."""
    path = os.environ.get(ENV)
    if not path:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    times = StepTimes(path)
    HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.forward",
                          times.timed("forward", rows=True), HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.run_batch", times.timed("run"), HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.get_next_batch_to_run", times.timed("schedule", ran=True), HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.process_batch_result", times.timed("result", last=True), HookType.AROUND)
