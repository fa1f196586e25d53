"""vLLM's speculative-decoding counters read back in the form `common/` records them, and the width planner's
choices (`common.width_planner`) read from the engine's worker."""

from typing import Any

from parallel_decoding.common.acceptance import AcceptanceStats


def acceptance(llm: Any) -> AcceptanceStats:
    """Drafts, draft tokens and accepted tokens per position since an offline `LLM` started (needs log stats)."""
    metrics = {m.name: m for m in llm.get_metrics()}
    per_position = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return AcceptanceStats(
        num_drafts=metrics["vllm:spec_decode_num_drafts"].value,
        num_draft_tokens=metrics["vllm:spec_decode_num_draft_tokens"].value,
        accepted_per_position=list(per_position.values) if per_position else [],
    )


def planner(llm: Any) -> dict | None:
    """The width planner's `describe()` in an offline `LLM`'s worker, built with
    `worker_extension_cls="parallel_decoding.vllm_plugin.probe.StateProbe"` (None: the method does not adapt)."""
    return llm.collective_rpc("parallel_decoding_width_planner")[0] or None
