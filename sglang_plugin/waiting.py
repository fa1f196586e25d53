"""Whether requests wait for a place in SGLang's running batch, told to our worker's width planner after every batch
(`WidthPlanner.others_wait`): where none wait, the batch runs to its slowest request's end, and a step drafts only
where it is expected to speed that request up too."""

from typing import Any

from parallel_decoding.sglang_plugin.request_state import worker_of


def tell_planner(result: Any, scheduler: Any, *_: Any, **__: Any) -> None:
    """AFTER hook on `Scheduler.process_batch_result` (nothing to do without a mode that adapts its widths)."""
    worker = worker_of(scheduler)
    if worker is not None and worker.planner is not None:
        worker.planner.others_wait = bool(len(scheduler.waiting_queue))
