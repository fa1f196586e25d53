"""Requests aborted mid-stream and mid-window leave nothing behind: vLLM frees their KV blocks and the plugin its
per-request state (decoders, sampling parameters, generators), and the engine goes on serving."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from tests.support.vllm_cases import announce

SPECS = [
    {"method": "wedlm", "window": 8, "entropy_threshold": 5.0},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.3},
    {"method": "jacobi", "block_size": 4},
    {"method": "diffusion_self", "num_speculative_tokens": 4},
]


def plugin_entries(drafter) -> int:
    return sum(drafter.entries.values())


@pytest.mark.parametrize("spec", SPECS, ids=[s["method"] for s in SPECS])
def test_aborted_requests_leave_nothing(engine_dir, prompts, spec):
    params = [SamplingParams(temperature=t, seed=3, max_tokens=200, ignore_eos=True) for t in (0.0, 1.0)]
    with engine(engine_dir["qwen3"], spec) as llm:
        expected = llm.generate(prompts[:2], params[0])
        core = llm.llm_engine.engine_core.engine_core
        drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
        ids = [llm.llm_engine.add_request(f"abort-{i}", p, params[i % 2]) for i, p in enumerate(prompts[:16])]
        for step in range(12):
            llm.llm_engine.step()
            if step in (2, 7):  # half of the requests, then the rest, each time in the middle of their windows
                llm.llm_engine.abort_request(ids[step % 2 :: 2], internal=True)
        announce(llm)
        assert plugin_entries(drafter) == 0 and core.scheduler.kv_cache_manager.usage == 0
        assert not llm.llm_engine.has_unfinished_requests()
        again = llm.generate(prompts[:2], params[0])
        announce(llm)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in expected]
    assert plugin_entries(drafter) == 0


