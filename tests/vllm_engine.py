"""Helpers for the vLLM tests: in-process engines on tiny local checkpoints, and vLLM's spec-decode counters."""

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm import LLM

from common.acceptance import AcceptanceStats

ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 << 20,
    "max_model_len": 512,
    "dtype": "float32",
    "seed": 0,
    "disable_log_stats": False,
}


@contextmanager
def engine(model: Any, speculative_config: dict | None = None, **kwargs: Any) -> Iterator[LLM]:
    """An in-process `LLM` (float32, eager, small KV) that is torn down on exit."""
    llm = LLM(model=str(model), speculative_config=speculative_config, **{**ENGINE_ARGS, **kwargs})
    try:
        yield llm
    finally:
        del llm
        gc.collect()


def spec_stats(llm: LLM) -> AcceptanceStats:
    """vLLM's speculative-decoding counters since the engine started, as `common/` records them."""
    metrics = {m.name: m for m in llm.get_metrics()}
    per_position = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return AcceptanceStats(
        num_drafts=metrics["vllm:spec_decode_num_drafts"].value,
        num_draft_tokens=metrics["vllm:spec_decode_num_draft_tokens"].value,
        accepted_per_position=list(per_position.values) if per_position else [],
    )
