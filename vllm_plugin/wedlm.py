"""WeDLM streaming windows on vLLM: the window (filled slots first, masks after, RoPE on logical positions) is
the step's scheduled tokens, and the leading filled run is committed with the KV the step wrote.

vLLM's scheduler runs with no bonus token per step (`WindowScheduler`), so a step may commit nothing and the
committed run's KV is kept while the rest of the window is rolled back.
"""

from typing import Any

from parallel_decoding.vllm_plugin.commit import CommitProposer, CommitRequest


class WeDLMProposer(CommitProposer):
    context_margin = 0  # no sampled token per step
    def plan(self, runner: Any, planned: list[tuple[int, CommitRequest]]) -> dict[int, list[int]]:
        drafts = {}
        for row, state in planned:
            state.forward = state.decoder.next_forward()
            drafts[row] = state.forward.token_ids.tolist()
        return drafts
