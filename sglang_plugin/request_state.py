"""Scheduler hooks for the per-request state our workers hold: released right after the batch that finishes its
request (not at the next batch, which an idle server never runs), and counted in SGLang's `/server_info`
(`internal_states[i]["parallel_decoding_entries"]`) so that leaks can be checked from outside; the width planner's
choices and cost model beside them (`internal_states[i]["parallel_decoding_width_planner"]`) where the mode adapts."""

from typing import Any


def worker_of(scheduler: Any) -> Any:
    """The scheduler's worker where it is ours (a mode of ours runs), else None."""
    from parallel_decoding.sglang_plugin.worker import PluginWorker

    worker = getattr(scheduler, "draft_worker", None)
    return worker if isinstance(worker, PluginWorker) else None


def release_after_batch(result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
    """AFTER hook on `Scheduler.process_batch_result` (nothing to do without a mode)."""
    worker = worker_of(scheduler)
    if worker is not None:
        worker.release_finished()


def report_entries(result: Any, controller: Any, state: dict[str, Any]) -> None:
    """AFTER hook on `SchedulerInternalStateController._add_speculative` (nothing added without a mode)."""
    worker = worker_of(controller.scheduler)
    if worker is not None:
        state["parallel_decoding_entries"] = {"requests": len(worker.requests)}
        described = worker.describe_planner()
        if described is not None:
            state["parallel_decoding_width_planner"] = described
