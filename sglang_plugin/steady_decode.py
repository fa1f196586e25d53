"""A steady batch (`PluginWorker.steady`) run as SGLang's own decode step rather than through its speculative path:
no verify slots reserved in decode preparation, no batch snapshot around the worker, SGLang's sampler and its plain
result processing, as where no algorithm is selected. Decided before SGLang prepares the step (an AROUND hook on
`ScheduleBatch.prepare_for_decode`), undone right after its result is processed (an AFTER hook on
`Scheduler.process_batch_result`), so every other step, memory check, merge and filter sees the speculative batch.

Only where a plain step may run SGLang's decode forward at all (`PluginWorker.decodes_plainly`: no CUDA graphs), with
one-token pages (the verify slots reserved beyond the committed KV are released one by one) and no mixed chunks
(which prepare a running batch to mix it into a prefill). A step that is not steady is prepared as before.
"""

import weakref
from typing import Any

import torch

_worker: list[weakref.ref] = []  # this scheduler process's worker (`serve`), once one of our modes runs


def serve(worker: Any) -> None:
    """`worker` runs this process's decode steps (called as it is built)."""
    _worker[:] = [weakref.ref(worker)]


def current() -> Any:
    """This process's worker, None where no mode of ours was selected."""
    return _worker[0]() if _worker else None


def switches(worker: Any, batch: Any) -> bool:
    """Whether a steady step of `batch` may run as SGLang's own decode step."""
    return (worker.decodes_plainly and not worker.server_args.enable_mixed_chunk
            and batch.token_to_kv_pool_allocator.page_size == 1 and batch.hisparse_coordinator is None)


def release_reserve(batch: Any) -> None:
    """Free the verify slots SGLang's speculative preparation reserved beyond each request's committed KV, so that its
    own decode preparation allocates the step's slot as it does without speculation (after the first steady step of a
    run there are none)."""
    reqs = [req for req in batch.reqs if req.kv.kv_allocated_len > req.kv.kv_committed_len]
    if not reqs:
        return
    table = batch.req_to_token_pool.req_to_token
    batch.token_to_kv_pool_allocator.free(torch.cat([
        table[req.kv.req_pool_idx, req.kv.kv_committed_len : req.kv.kv_allocated_len] for req in reqs]).long())
    for req in reqs:
        req.kv.kv_allocated_len = req.kv.kv_committed_len


def prepare_for_decode(original: Any, batch: Any) -> Any:
    """AROUND hook on `ScheduleBatch.prepare_for_decode`: a steady step of our worker's batch is prepared as SGLang
    prepares a decode step without speculation (its last tokens as input, one slot a request); others as before."""
    worker = current()
    if (worker is None or batch.spec_algorithm.is_none() or not switches(worker, batch)
            or not worker.steady_step(batch)):
        return original(batch)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    release_reserve(batch)
    for req in batch.reqs:  # SGLang's `spec_verify_ct` counts each decode step of ours, before it streams the output
        req.spec_verify_ct += 1
    worker.switched = batch.spec_algorithm
    batch.spec_algorithm, batch.spec_info = SpeculativeAlgorithm.NONE, None
    batch.input_ids = torch.tensor([req.output_ids[-1] for req in batch.reqs], device=batch.device)
    batch.orig_seq_lens = batch.seq_lens.to(torch.int32)
    return original(batch)


def restore(result: Any, scheduler: Any, batch: Any, *_: Any, **__: Any) -> None:
    """AFTER hook on `Scheduler.process_batch_result`: a batch switched for its step (`prepare_for_decode`) is the
    speculative batch again, SGLang's speculative metrics counting the step as every plain step of ours counts."""
    worker = current()
    if worker is None or worker.switched is None or not batch.spec_algorithm.is_none():
        return
    batch.spec_algorithm, worker.switched = worker.switched, None
    size = len(batch.reqs)
    batch.spec_info = worker.draft_input(batch.seq_lens)
    scheduler.metrics_reporter.update_spec_metrics(size, 0, num_accept_tokens=size)
