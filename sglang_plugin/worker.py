"""SGLang's speculative worker slot filled with our decoders: each decode step forwards one fixed-width window
per request (`[seed, drafts]`, chain-causal) on SGLang's paged KV, verifies it with `common.acceptance.verify`
and hands SGLang the committed run; the unaccepted tail's KV is simply overwritten next step.

Prefill and extend batches run as SGLang runs them. Which drafts a request carries is the mode's business
(`sglang_plugin.drafters`), which may run extra forwards of its own through `run_window`.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_info import NgramVerifyInput

from common.acceptance import verify
from common.sampling import SamplingParams
from sglang_plugin.cli import decode_settings


@dataclass
class Drafts:
    """One request's drafts for this step and, when they were sampled, the proposal they were drawn from."""

    tokens: list[int]
    probs: torch.Tensor | None = None


@dataclass
class RequestState:
    """What a request keeps between steps: its sampling, its generator, and the mode's own state."""

    sampling: SamplingParams
    generator: torch.Generator
    mode_state: dict[str, Any] = field(default_factory=dict)


def sampling_of(req: Any) -> SamplingParams:
    """SGLang's per-request sampling settings in `common/`'s terms (SGLang stores greedy as top_k 1)."""
    params = req.sampling_params
    top_k = params.top_k if 0 < params.top_k < (1 << 30) else 0
    seed = getattr(params, "sampling_seed", None)
    if top_k == 1 or params.temperature == 0:
        return SamplingParams(seed=seed)
    return SamplingParams(temperature=float(params.temperature), top_p=float(params.top_p), top_k=int(top_k),
                          seed=seed)


class WindowWorker(BaseSpecWorker):
    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any, **_: Any) -> None:
        super().__init__()
        from sglang_plugin.drafters import make_drafter

        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = self.model_runner.device
        self.width = server_args.speculative_num_draft_tokens
        mode, config = decode_settings(server_args)
        self.drafter = make_drafter(mode, config, self)
        self.requests: dict[str, RequestState] = {}

    @property
    def draft_worker(self) -> None:
        return None

    def alloc_memory_pool(self, **_: Any) -> None:
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()

    def init_attention_backends(self) -> None:
        """The target's backends run every window; there is no draft model."""

    def init_cuda_graphs(self) -> None:
        """Windows run eagerly."""

    def clear_cache_pool(self) -> None:
        self.requests.clear()

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        """No adaptive draft length."""

    def state(self, req: Any) -> RequestState:
        if req.rid not in self.requests:
            sampling = sampling_of(req)
            self.requests[req.rid] = RequestState(sampling, sampling.generator())
        return self.requests[req.rid]

    def run_window(self, batch: Any, tokens: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Forward `tokens` [bs, W] at the positions after each request's cached KV, row i seeing the whole prefix
        and the window rows `visible` [bs, W, W] allows; KV goes to the slots SGLang reserved. Logits [bs, W, V]."""
        bs, width = tokens.shape
        device = batch.seq_lens.device
        positions = batch.seq_lens[:, None].long() + torch.arange(width, device=device)
        table = self.req_to_token_pool.req_to_token
        locations = table[batch.req_pool_indices[:, None].long(), positions].long()
        masks = [torch.cat([torch.ones(width, int(prefix), dtype=torch.bool, device=device), rows.to(device)], 1)
                 for prefix, rows in zip(batch.seq_lens.tolist(), visible, strict=True)]
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = tokens.flatten().to(device)
        batch.out_cache_loc = locations.flatten()
        mask = torch.cat([m.flatten() for m in masks])
        batch.spec_info = NgramVerifyInput(draft_token=batch.input_ids, custom_mask=mask, positions=positions.flatten(),
                                           draft_token_num=width)
        result = self._target_worker.forward_batch_generation(batch, is_verify=True)
        return result.logits_output.next_token_logits.view(bs, width, -1)

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None) -> Any:
        if not batch.forward_mode.is_decode():
            return self.prefill(batch, on_publish)
        self.forget(batch)
        states = [self.state(req) for req in batch.reqs]
        seeds = [req.output_ids[-1] for req in batch.reqs]
        drafts = self.drafter.draft(batch, batch.reqs, states, seeds)
        tokens = torch.tensor([[seed, *d.tokens] + [seed] * (self.width - 1 - len(d.tokens))
                               for seed, d in zip(seeds, drafts, strict=True)])
        chain = torch.ones(self.width, self.width, dtype=torch.bool).tril().expand(len(seeds), -1, -1)
        logits = self.run_window(batch, tokens, chain).float()
        committed = []
        for row, (state, d) in enumerate(zip(states, drafts, strict=True)):
            rows = logits[row, : len(d.tokens) + 1].cpu()
            committed.append(verify(torch.tensor(d.tokens, dtype=torch.long), rows, state.sampling, state.generator,
                                    d.probs))
        self.drafter.after_verify(batch.reqs, states, logits, drafts, committed)
        return self.result(batch, committed, on_publish)

    def forget(self, batch: Any) -> None:
        """Drop the state of requests no longer decoding."""
        live = {req.rid for req in batch.reqs}
        for rid in [rid for rid in self.requests if rid not in live]:
            del self.requests[rid]

    def result(self, batch: Any, committed: list[list[int]], on_publish: Any) -> Any:
        """SGLang's speculative result: committed runs padded to the window width, their lengths, new KV lengths."""
        accept_lens = torch.tensor([len(c) for c in committed], dtype=torch.int32, device=self.device)
        padded = torch.tensor([c + [0] * (self.width - len(c)) for c in committed], device=self.device)
        new_seq_lens = batch.seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        batch.forward_mode = ForwardMode.DECODE
        return GenerationBatchResult(
            logits_output=None, next_token_ids=padded.flatten(), can_run_cuda_graph=False,
            accept_lens=accept_lens, new_seq_lens=new_seq_lens,
            next_draft_input=NgramVerifyInput(draft_token_num=self.width, new_seq_lens=new_seq_lens,
                                              accept_tokens=padded.flatten(), accept_lens=accept_lens),
            speculative_num_draft_tokens=self.width,
        )

    def prefill(self, batch: Any, on_publish: Any) -> Any:
        """A prefill or extend batch as SGLang runs it; its sampled token opens the first window."""
        result = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=None)
        predict = result.next_token_ids
        bs = len(batch.reqs)
        new_seq_lens = batch.seq_lens.clone()
        accept_tokens = torch.zeros(bs, self.width, dtype=torch.int32, device=self.device)
        accept_tokens[:, 0] = predict
        accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        if on_publish is not None:
            on_publish(new_seq_lens)
        return GenerationBatchResult(
            logits_output=result.logits_output, next_token_ids=predict, can_run_cuda_graph=result.can_run_cuda_graph,
            accept_lens=accept_lens, new_seq_lens=new_seq_lens,
            next_draft_input=NgramVerifyInput(draft_token_num=self.width, new_seq_lens=new_seq_lens,
                                              accept_tokens=accept_tokens.flatten(), accept_lens=accept_lens),
            speculative_num_draft_tokens=self.width,
        )
