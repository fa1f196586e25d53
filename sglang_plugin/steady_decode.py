"""A steady batch (`PluginWorker.steady`) run as SGLang's own decode step rather than through its speculative path:
no verify slots reserved, no batch snapshot around the worker, SGLang's sampler and its plain result processing, as
where no algorithm is selected. Switched before SGLang prepares a steady step (an AROUND hook on
`ScheduleBatch.prepare_for_decode`) and kept so while its steps stay steady, so that between them SGLang's memory
check, filtering and result processing see a plain batch too. Switched back before the memory check of a step whose
requests changed (an AROUND hook on `ScheduleBatch.check_decode_mem`: that step is not steady), or as the step is
prepared where the planner drafts for the same requests; merges, retraction and every other step see the speculative
batch.

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


def held(worker: Any, batch: Any) -> bool:
    """Whether `batch` is the one `worker` switched to SGLang's plain decode (`switch`) and still is."""
    return worker.switched is not None and worker.switched[0]() is batch and batch.spec_algorithm.is_none()


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


def switch(worker: Any, batch: Any) -> None:
    """Make `batch` a plain batch, as SGLang's decode without speculation holds it, until `switch_back`."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    release_reserve(batch)
    worker.plain_runs += 1
    worker.switched = (weakref.ref(batch), batch.spec_algorithm)
    batch.spec_algorithm, batch.spec_info = SpeculativeAlgorithm.NONE, None


def switch_back(worker: Any, batch: Any) -> None:
    """Make a switched `batch` the speculative batch again, with the draft state our worker's steps leave on it."""
    batch.spec_algorithm, worker.switched = worker.switched[1], None
    batch.spec_info = worker.draft_input(batch.seq_lens)


def fits_speculative(worker: Any, batch: Any) -> bool:
    """Switch a held `batch` back for a step the planner drafts in; whether its verify slots fit, which SGLang checked
    for a plain step only. Where they do not, it stays plain for this step: its requests are the steady step's (or
    those retraction left of them), every one greedy with its logits as the model gives them."""
    switch_back(worker, batch)
    if batch.check_decode_mem():
        return True
    switch(worker, batch)
    return False


def plain(original: Any, batch: Any) -> Any:
    """SGLang's decode preparation without speculation for a switched `batch` (its last tokens as input, one slot a
    request), its requests' `spec_verify_ct` counting the step as each decode step of ours counts, before its output
    is streamed."""
    for req in batch.reqs:
        req.spec_verify_ct += 1
    batch.input_ids = torch.tensor([req.output_ids[-1] for req in batch.reqs], device=batch.device)
    batch.orig_seq_lens = batch.seq_lens.to(torch.int32)
    return original(batch)


def prepare_for_decode(original: Any, batch: Any) -> Any:
    """AROUND hook on `ScheduleBatch.prepare_for_decode`: a steady step of our worker's batch is prepared as SGLang
    prepares a decode step without speculation; others as before."""
    worker = current()
    if worker is None:
        return original(batch)
    if held(worker, batch):
        if worker.steady_step(batch) or not fits_speculative(worker, batch):
            return plain(original, batch)
        return original(batch)
    if batch.spec_algorithm.is_none() or not switches(worker, batch) or not worker.steady_step(batch):
        return original(batch)
    switch(worker, batch)
    return plain(original, batch)


def check_decode_mem(original: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on `ScheduleBatch.check_decode_mem`: a held batch whose requests are no longer its last steady
    step's (some finished or were merged in) is switched back before SGLang checks its next step's memory, which will
    not be steady. Retraction's checks of a subset (`selected_indices`) pass through."""
    worker = current()
    if (worker is not None and not args and kwargs.get("selected_indices") is None and held(worker, batch)
            and worker.steady_batch != [req.rid for req in batch.reqs]):
        switch_back(worker, batch)
    return original(batch, *args, **kwargs)


def count_step(result: Any, scheduler: Any, batch: Any, *_: Any, **__: Any) -> None:
    """AFTER hook on `Scheduler.process_batch_result`: SGLang's speculative metrics count a step of a held batch as
    every plain step of ours counts."""
    worker = current()
    if worker is not None and held(worker, batch):
        size = len(batch.reqs)
        scheduler.metrics_reporter.update_spec_metrics(size, 0, num_accept_tokens=size)
