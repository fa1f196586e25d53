"""NLD block diffusion on vLLM: bidirectional reveal forwards over the paged prefix run between steps, then the
revealed block is the step's draft and one causal forward commits it with its KV and gives the next seed.
"""

from typing import Any

from parallel_decoding.common.row_stats import apply_rows
from parallel_decoding.common.window import Attention
from parallel_decoding.vllm_plugin.commit import CommitProposer, CommitRequest
from parallel_decoding.vllm_plugin.paged_forward import PagedWindow, run_windows


class DiffusionProposer(CommitProposer):
    def plan(self, runner: Any, planned: list[tuple[int, CommitRequest]]) -> dict[int, list[int]]:
        """Reveal every request's block, batching the requests still revealing, until each needs its commit."""
        drafts: dict[int, list[int]] = {}
        while planned:
            revealing = []
            for row, state in planned:
                forward = state.decoder.next_forward()
                if forward.attention is Attention.BIDIRECTIONAL:
                    revealing.append((row, state, PagedWindow(row, state.decoder.cache_len, forward)))
                else:
                    state.forward = forward
                    drafts[row] = forward.token_ids[1:].tolist()
            if not revealing:
                break
            logits = run_windows(runner, [window for _, _, window in revealing])
            widths = [window.forward.logit_rows.numel() for _, _, window in revealing]
            outcomes = apply_rows([state.decoder for _, state, _ in revealing], logits, widths, margins=False)
            planned = []
            for (row, state, _), outcome in zip(revealing, outcomes, strict=True):
                committed = outcome.committed
                if committed:
                    state.pending = drafts[row] = committed
                else:
                    planned.append((row, state))
        return drafts
