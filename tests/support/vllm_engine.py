"""Helpers for the vLLM tests: in-process engines on tiny local checkpoints."""

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm import LLM

ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 << 20,
    "max_model_len": 512,
    "block_size": 32,
    "dtype": "float32",
    "seed": 0,
    "disable_log_stats": False,
}


@contextmanager
def engine(model: Any, speculative_config: dict | None = None, **kwargs: Any) -> Iterator[LLM]:
    """An in-process `LLM` (float32, eager, small KV, 32-token blocks) that is torn down on exit: shut down there,
    not when collected, which a failed test's traceback (holding the `LLM`) would delay past the next engine's
    start, tearing down that one's process groups."""
    llm = LLM(model=str(model), speculative_config=speculative_config, **{**ENGINE_ARGS, **kwargs})
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
