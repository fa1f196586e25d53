"""Quadratic self-speculation on vLLM (`diffusion_self` with `"mode": "quadratic"`): one forward per step.

Each request keeps a `common.quadratic_self_spec` decoder. The step's scheduled tokens are the decoder's forward:
the chain `[seed, drafts]` the engine computes causally, then one group per chain token whose structured mask
`vllm_plugin.group_attention` applies inside the same forward. The decoder verifies the chain (its own rejection
rule and seeded generator) and drafts from the last accepted token's group; vLLM keeps the KV of the accepted
chain, which is where the engine wrote it. A draft adapter (`draft_adapter`) is on for the groups' rows of the
forward only: the chain's rows see no group row, so they verify with the base model exactly. Where the config
adapts (the default), a width planner caps each request's drafts per step before it plans
(`common.width_planner.cap_widths`).
"""

from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch

from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.width_planner import cap_widths
from parallel_decoding.vllm_plugin import group_attention
from parallel_decoding.vllm_plugin.commit import CommitProposer, CommitRequest
from parallel_decoding.vllm_plugin.group_attention import GroupedWindow


class QuadraticSelfSpecProposer(CommitProposer):
    lora: LoRA | None = None

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.layers: dict[str, Any] = vllm_config.compilation_config.static_forward_context

    def load_model(self, target_model: torch.nn.Module) -> None:
        """The model's attention layers exist now: wrap them, once, to run the groups' passes."""
        group_attention.install(self.layers)

    def plan(self, runner: Any, planned: list[tuple[int, CommitRequest]]) -> dict[int, list[int]]:
        if self.planner is not None and planned:
            cap_widths(self.planner, [runner.input_batch.req_ids[row] for row, _ in planned],
                       [state.decoder for _, state in planned])
        drafts = {}
        req_ids = runner.input_batch.req_ids
        for row, state in planned:
            if state.decoder.width == 0 and self.pause(runner, req_ids[row], state):
                drafts[row] = []
                continue
            if state.idle:
                self.wake(runner, row, state)
                if state.decoder.finished:  # woken at its last step: the token vLLM just sampled ends it
                    drafts[row] = []
                    continue
            state.forward = state.decoder.next_forward()
            drafts[row] = state.forward.token_ids[1:].tolist()
        return drafts

    def attending(self, runner: Any) -> AbstractContextManager:
        if self.steady(runner.input_batch.req_ids):
            return nullcontext()
        queries = runner.query_start_loc.np[: runner.input_batch.num_reqs + 1]
        windows, adapted = [], []
        for row, req_id in enumerate(runner.input_batch.req_ids):
            state, end = self.requests.get(req_id), int(queries[row + 1])
            if state is None or not self.scheduled_window(runner, req_id, state, end - int(queries[row])):
                continue
            decoder, forward = state.decoder, state.forward
            chain, group = decoder.drafts.numel() + 1, decoder.group_masks + 1
            if forward.num_tokens > chain:  # the chain alone near the end of the context
                windows.append(GroupedWindow(end - forward.num_tokens, row, decoder.cache_len, chain, group,
                                             forward.positions[chain:]))
                if forward.adapter_rows is not None:
                    adapted.append(forward.adapter_rows + (end - forward.num_tokens))
        stack = ExitStack()
        stack.enter_context(group_attention.grouped(group_attention.plan_step(runner, windows) if windows else None))
        if adapted:
            stack.enter_context(self.adapter(runner).enabled(torch.cat(adapted)))
        return stack

    def adapter(self, runner: Any) -> LoRA:
        """The draft adapter, loaded onto the served model's modules once."""
        if self.lora is None:
            self.lora = LoRA(runner.get_model(), self.config.draft_adapter)
        return self.lora
