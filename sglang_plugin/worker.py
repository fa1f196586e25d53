"""SGLang's speculative worker slot, filled by our modes: what every mode shares. A mode's step forwards one
window per request (`run_window`: plugin tokens, logical positions and mask over SGLang's paged KV, in the slots
its scheduler reserved) and returns the tokens the step commits in SGLang's V2 result form (`result`).

Two kinds of modes subclass it: verifying ones (`sglang_plugin.verify`) and ones whose own rule commits
(`sglang_plugin.commit`).
"""

import copy
import logging
import time
import weakref
from dataclasses import replace
from typing import Any

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_info import NgramVerifyInput

from parallel_decoding.common.sampling import SamplingParams
from parallel_decoding.sglang_plugin import steady_decode
from parallel_decoding.sglang_plugin.cli import decode_settings
from parallel_decoding.sglang_plugin.logprobs import Entry, decode_output, fill_prefill

logger = logging.getLogger(__name__)


def sampling_of(req: Any, adjustments: bool = False, resumed: bool = True) -> SamplingParams:
    """SGLang's per-request sampling settings in `common/`'s terms and by SGLang's definitions (`rules`; SGLang
    stores greedy as top_k 1); `adjustments`: with its penalties, logit bias and minimum length (`common.penalties`),
    `min_new_tokens` counted past the output so far (`resumed`: a committing decoder, which holds every token so far
    as its prompt) or from the request's prompt (the verify worker, which counts the output itself)."""
    params = req.sampling_params
    top_k = params.top_k if 0 < params.top_k < (1 << 30) else 0
    seed = getattr(params, "sampling_seed", None)
    if top_k == 1 or params.temperature == 0:
        sampling = SamplingParams(seed=seed, rules="sglang")
    else:
        sampling = SamplingParams(temperature=float(params.temperature), top_p=float(params.top_p), top_k=int(top_k),
                                  min_p=float(params.min_p or 0.0), seed=seed, rules="sglang")
    if not adjustments:
        return sampling
    done = len(req.output_ids) if resumed else 0
    return replace(sampling, presence_penalty=float(params.presence_penalty),
                   frequency_penalty=float(params.frequency_penalty),
                   repetition_penalty=float(params.repetition_penalty),
                   logit_bias=tuple(sorted((int(t), float(b)) for t, b in (params.logit_bias or {}).items())),
                   min_tokens=max(int(params.min_new_tokens) - done, 0), stop_token_ids=stop_ids(req))


def catch_up(decoder: Any, req: Any) -> None:
    """A paused decoder (`common.decoder.Decoder.pause`) takes the tokens SGLang committed for `req` since it
    paused; a token lost on the way fails here rather than in the text."""
    decoder.catch_up(req.output_ids[decoder.num_tokens - len(req.origin_input_ids) :])
    assert decoder.num_tokens == len(req.origin_input_ids) + len(req.output_ids), "a paused request lost a token"


def stop_ids(req: Any) -> tuple[int, ...]:
    """What SGLang's `min_new_tokens` holds back: the request's stop tokens and its EOS ids."""
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    tokenizer = getattr(req, "tokenizer", None)
    if tokenizer is not None:
        ids |= set(tokenizer.additional_stop_token_ids or ()) | {tokenizer.eos_token_id}
    return tuple(sorted(i for i in ids if i is not None))


def window_mask(starts: torch.Tensor, visible: torch.Tensor, cached: int) -> torch.Tensor:
    """SGLang's flat custom mask for windows [bs, W] after `starts` [bs] cached tokens (`cached` in all): request
    by request, its W rows of [cached prefix (all seen), window (`visible` [bs, W, W])], built in one scatter."""
    bs, width = visible.shape[:2]
    row_len = starts + width
    sizes = width * row_len
    offsets = sizes.cumsum(0) - sizes
    steps = torch.arange(width, device=starts.device)
    index = (offsets + starts)[:, None, None] + steps[:, None] * row_len[:, None, None] + steps
    mask = torch.ones(width * (cached + bs * width), dtype=torch.bool, device=starts.device)
    mask[index.flatten()] = visible.flatten()
    return mask


class PluginWorker(BaseSpecWorker):
    # Tokens of a step that are not drafts (SGLang's accept statistics subtract them).
    non_draft_tokens = 1
    planner: Any = None  # the mode's width planner (`common.width_planner`), None where it does not adapt
    steady_batch: list[str] | None = None  # the last plain step's requests, while each needs no per-request work
    steady_steps = 0  # plain steps run as a steady batch (`steady`)
    switched: Any = None  # the batch switched to SGLang's own decode steps and its algorithm (`steady_decode`)
    own_steps = 0  # steady steps run as SGLang's own decode step (`own_decode`)
    plain_runs = 0  # times a batch was switched to SGLang's own decode steps (`steady_decode.switch`)
    step_rids: list[str] | None = None  # the decode step's requests (`begin`)

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any, **_: Any) -> None:
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = self.model_runner.device
        self.width = server_args.speculative_num_draft_tokens
        self.mode, self.config = decode_settings(server_args)
        # Per request id: the request object SGLang holds (weakly) and the mode's state for it.
        self.requests: dict[str, tuple[weakref.ref, Any]] = {}
        self.placeholders: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # `draft_input`'s, per batch size
        steady_decode.serve(self)

    @property
    def draft_worker(self) -> None:
        return None

    @property
    def decodes_plainly(self) -> bool:
        """Whether a step with no drafts may run as SGLang's own decode forward (`run_decode`): only where SGLang
        captured no decode graphs, since those are captured for our verify window's width and a decode batch, which
        carries no speculative input, would replay one; elsewhere it runs as a one-row window (eager)."""
        return self.model_runner.decode_cuda_graph_runner is None

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

    def keep(self, req: Any, state: Any) -> None:
        """Hold a request's state while SGLang holds the request."""
        self.requests[req.rid] = (weakref.ref(req), state)

    def held(self, req: Any) -> Any:
        """The state kept for this very request (not for an earlier one under the same id), else None."""
        owner, state = self.requests.get(req.rid, (None, None))
        return state if owner is not None and owner() is req else None

    def release_finished(self) -> None:
        """Drop the state of requests that finished or that SGLang let go (called after every batch); a request
        retracted under memory pressure keeps its own while it waits to be prefilled again."""
        for rid, (owner, _) in list(self.requests.items()):
            req = owner()
            if req is None or req.finished():
                del self.requests[rid]
                self.dropped(rid)

    def dropped(self, rid: str) -> None:
        """A request's state was let go."""

    def describe_planner(self) -> dict[str, float] | None:
        """The width planner's choices and cost model (`WidthPlanner.describe`) and the steady steps, None where the
        mode has no planner."""
        return None if self.planner is None else {**self.planner.describe(), "steady_steps": self.steady_steps,
                                                  "own_decode_steps": self.own_steps, "plain_runs": self.plain_runs}

    def steady(self, rids: list[str], limits: list[int] | None = None) -> bool:
        """Whether the step's batch is the one a worker's last plain step left needing no per-request work
        (`steady_batch`, set by the worker; a prefill ends it), and the planner holds those requests at no draft again
        (`WidthPlanner.plain_again`, given their `limits` where they may have changed). Under load most steps are
        such: SGLang's AR step (`plain_step`), no decoder looked at, no drafts laid out or verified."""
        if self.steady_batch == rids and self.planner is not None and self.planner.plain_again(rids, limits):
            self.steady_steps += 1
            return True
        self.steady_batch = None
        return False

    def steady_step(self, batch: Any) -> bool:
        """Whether `batch`'s coming decode step is steady (`steady`, counted as such), asked before SGLang prepares it
        (`sglang_plugin.steady_decode`); a mode whose steps may be steady says so."""
        return False

    def own_decode(self, batch: Any) -> Any:
        """A steady step SGLang prepared as its own decode step (`sglang_plugin.steady_decode`): its forward and
        sampler (every request greedy, its logits unadjusted), timed for the planner's cost model as a plain step."""
        started = self.begin([req.rid for req in batch.reqs])
        result = self._target_worker.forward_batch_generation(batch)
        self.observe(len(batch.reqs), 0, started)
        self.own_steps += 1
        return result

    def plain_step(self, batch: Any, on_publish: Any, started: float) -> Any:
        """SGLang's decode forward of each request's last token, each row's argmax its token: the step's result, its
        time told to the planner's cost model as a plain step's."""
        logits = self.run_decode(batch, torch.tensor([req.output_ids[-1] for req in batch.reqs]))
        tokens = logits[:, 0].argmax(-1).to(self.device)
        self.observe(len(batch.reqs), 0, started)
        accept_lens = torch.ones(len(tokens), dtype=torch.int32, device=self.device)
        return self.runs_result(batch, tokens, accept_lens, 1, on_publish, None)

    def begin(self, rids: list[str]) -> float:
        """A decode step of the requests `rids` begins: told to the planner (`common.width_planner.StepGap`); its
        start time."""
        if self.planner is not None:
            self.planner.began(rids)
        self.step_rids = rids
        return time.perf_counter()

    def observe(self, rows: int, drafting: int, started: float) -> None:
        """The step's rows and measured time to the planner's cost model (logged now and then)."""
        if self.planner is not None:
            report = self.planner.observe(rows, drafting, time.perf_counter() - started, self.step_rids)
            if report is not None:
                logger.info("parallel-decoding width planner (%s): %s", self.mode, report)

    def run_window(self, batch: Any, tokens: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor | None = None,
                   starts: torch.Tensor | None = None, locations: torch.Tensor | None = None) -> torch.Tensor:
        """Forward `tokens` [bs, W], row i of request r at physical position `starts[r] + i` (default: after the
        KV SGLang counts) and logical `positions` (default: the physical ones), seeing its request's first
        `starts[r]` cached tokens and the window rows `visible` [bs, W, W] allows. KV goes to `locations`
        (default: the slots SGLang reserved at those physical positions). Logits [bs, W, V]."""
        bs, width = tokens.shape
        device = batch.seq_lens.device
        starts = batch.seq_lens.long() if starts is None else starts.to(device).long()
        physical = starts[:, None] + torch.arange(width, device=device)
        positions = physical if positions is None else positions.to(device)
        if locations is None:
            table = self.req_to_token_pool.req_to_token
            locations = table[batch.req_pool_indices[:, None].long(), physical].long()
        view = copy.copy(batch)
        view.forward_mode = ForwardMode.TARGET_VERIFY
        view.input_ids = tokens.flatten().to(device)
        view.out_cache_loc = locations.flatten().to(device)
        view.seq_lens = starts.to(batch.seq_lens.dtype)
        view.seq_lens_cpu = starts.cpu()
        view.seq_lens_sum = int(starts.sum())
        view.extend_lens = view.prefix_lens = view.extend_logprob_start_lens = None
        view.return_logprob = False
        mask = window_mask(starts, visible.to(device), view.seq_lens_sum)
        view.spec_info = NgramVerifyInput(draft_token=view.input_ids, custom_mask=mask, positions=positions.flatten(),
                                          draft_token_num=width)
        result = self._target_worker.forward_batch_generation(view, is_verify=True)
        return result.logits_output.next_token_logits.view(bs, width, -1)

    def run_decode(self, batch: Any, tokens: torch.Tensor) -> torch.Tensor:
        """SGLang's own decode forward of one token per request (`tokens` [bs], each at the physical position after
        the KV SGLang counts, into the slot it reserved there): what a step in which no request drafts runs instead of
        a one-row window (no custom mask, the decode attention kernels). Logits [bs, 1, V]."""
        device = batch.seq_lens.device
        starts = batch.seq_lens.long()
        view = copy.copy(batch)
        view.forward_mode = ForwardMode.DECODE
        view.input_ids = tokens.to(device)
        view.out_cache_loc = self.req_to_token_pool.req_to_token[batch.req_pool_indices.long(), starts].long()
        view.seq_lens = (starts + 1).to(batch.seq_lens.dtype)
        view.seq_lens_cpu = view.seq_lens.cpu()
        view.seq_lens_sum = int(view.seq_lens_cpu.sum())
        view.extend_lens = view.prefix_lens = view.extend_logprob_start_lens = None
        view.return_logprob = False
        view.spec_info = None
        result = self._target_worker.forward_batch_generation(view, is_verify=True)
        return result.logits_output.next_token_logits[:, None]

    def result(self, batch: Any, committed: list[list[int]], on_publish: Any,
               logprobs: list[list[Entry]] | None = None) -> Any:
        """SGLang's speculative result for a decode step: committed runs padded to one width, their lengths, new
        KV lengths, and the runs' logprobs where requests ask for them."""
        accept_lens = torch.tensor([len(c) for c in committed], dtype=torch.int32, device=self.device)
        stride = max(1, *(len(c) for c in committed))
        padded = torch.tensor([c + [0] * (stride - len(c)) for c in committed], device=self.device)
        output = None if logprobs is None else decode_output(logprobs, stride, self.device)
        return self.runs_result(batch, padded.flatten(), accept_lens, stride, on_publish, output)

    def runs_result(self, batch: Any, tokens: torch.Tensor, accept_lens: torch.Tensor, stride: int, on_publish: Any,
                    output: Any) -> Any:
        """SGLang's speculative result from the committed runs, `tokens` [bs * stride] (each run padded to `stride`)
        with their lengths `accept_lens`, and their logprobs' `output`."""
        new_seq_lens = batch.seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        return GenerationBatchResult(
            logits_output=output, next_token_ids=tokens, can_run_cuda_graph=False,
            accept_lens=accept_lens, new_seq_lens=new_seq_lens,
            next_draft_input=self.draft_input(new_seq_lens, accept_lens),
            speculative_num_draft_tokens=self.width, speculative_output_stride=stride,
            num_non_draft_tokens_per_req=self.non_draft_tokens,
        )

    def prefill_result(self, batch: Any, result: Any, first: torch.Tensor, on_publish: Any,
                       logprobs: list[Entry] | None = None) -> Any:
        """SGLang's result for a prefill or extend batch whose requests emit `first` [bs] (with `logprobs` where
        requests ask for them)."""
        if logprobs is not None:
            fill_prefill(result.logits_output, logprobs)
        new_seq_lens = batch.seq_lens.clone()
        accept_lens = torch.ones(len(batch.reqs), dtype=torch.int32, device=self.device)
        if on_publish is not None:
            on_publish(new_seq_lens)
        return GenerationBatchResult(
            logits_output=result.logits_output, next_token_ids=first, can_run_cuda_graph=result.can_run_cuda_graph,
            accept_lens=accept_lens, new_seq_lens=new_seq_lens,
            next_draft_input=self.draft_input(new_seq_lens, accept_lens),
            speculative_num_draft_tokens=self.width,
        )

    def draft_input(self, new_seq_lens: torch.Tensor, accept_lens: torch.Tensor | None = None) -> Any:
        """The draft state SGLang keeps on the batch between steps (filtered and merged with it; `accept_lens`: one
        token each where not given). Our workers keep their own, so its tokens are placeholders of SGLang's fixed
        width, made once per batch size (SGLang only reads them, filtering and merging into new tensors)."""
        size = len(new_seq_lens)
        if size not in self.placeholders:
            self.placeholders[size] = (torch.zeros(size * self.width, dtype=torch.int32, device=self.device),
                                       torch.ones(size, dtype=torch.int32, device=self.device))
        tokens, ones = self.placeholders[size]
        return NgramVerifyInput(draft_token_num=self.width, new_seq_lens=new_seq_lens, accept_tokens=tokens,
                                accept_lens=ones if accept_lens is None else accept_lens)
