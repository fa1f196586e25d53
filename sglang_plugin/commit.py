"""Modes whose `common/` decoder commits on SGLang (WeDLM windows, NLD block diffusion, Jacobi with rejection
recycling): each request keeps its decoder, every decode step forwards the decoder's planned window and the
decoder's commits are the step's tokens (possibly none), sampled with the decoder's own seeded generator as
`common.generate` samples, under the request's structured output if it has one (`own_grammar`, `common.grammar`).

A step in which the width planner holds every request at no draft, each of them greedy and unadjusted, is
SGLang's own AR step: the decoders pause (`common.decoder.Decoder.pause`), the rows' argmax is committed, and a
decoder catches up on those tokens when it drafts again (`PooledDecoder.wake`).

SGLang holds the KV of all its tokens but the last; a decoder may count more tokens as cached than SGLang's
pool has (KV written in scratch slots, or never written). Those rows are recomputed at the front of the next
window (`common.window.after_rows`), and a token is handed to SGLang only once the KV before it is in the pool.
"""

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.mem_cache.allocation import alloc_token_slots

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.jacobi import JacobiDecoder
from parallel_decoding.common.logprob_rows import LogprobRows, logprob_rows
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import make_decoder
from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecDecoder
from parallel_decoding.common.row_stats import apply_rows, rows_of
from parallel_decoding.common.width_planner import cap_widths, planner_for
from parallel_decoding.common.window import Attention, Forward, after_rows
from parallel_decoding.sglang_plugin.logprobs import MISSING, Asked, Entry, asked, entries
from parallel_decoding.sglang_plugin.worker import PluginWorker, catch_up, sampling_of


@dataclass
class PooledDecoder:
    """A request's decoder and how many of its leading tokens have their KV in SGLang's pool; where the request
    asks for logprobs, its committed tokens' entries by position until emitted, the first position without one,
    and the row carried for the next token (`common.logprob_rows`)."""

    decoder: Decoder
    pooled: int
    emitted_before: int = 0
    planned: Forward | None = None
    asked: Asked | None = None
    logprobs: dict[int, Entry] = field(default_factory=dict)
    logged: int = 0
    carried: tuple[int, torch.Tensor] | None = None
    paused: bool = False  # SGLang's decode forward takes its plain AR steps (`CommitWorker.pauses`)

    def window(self) -> Forward:
        """The decoder's next forward (none once it finished) after the cached rows the pool lacks."""
        decoder = self.decoder
        self.planned = None if decoder.finished else decoder.next_forward()
        cached = decoder.cache_len if self.planned is not None else decoder.num_tokens - 1
        return after_rows(self.planned, decoder.tokens[self.pooled : cached], self.pooled)

    def digested(self, window: Forward) -> None:
        """The window's KV is now pooled (its decoder, if it planned one, has digested the window's rows)."""
        self.pooled = self.pooled + window.num_tokens if self.planned is None else self.decoder.cache_len

    def pausable(self, req: Any, seq_len: int) -> bool:
        """Whether its decoder, held at no draft, may pause for plain AR steps that SGLang's decode forward runs and
        the row's argmax commits: that is what it would commit (greedy, no penalty, bias or grammar; no logprobs
        asked), and SGLang holds its every token, with the KV of all but the last."""
        decoder = self.decoder
        return (not decoder.finished and decoder.sampling.greedy and not decoder.reads_logits and self.asked is None
                and self.pooled == seq_len == decoder.num_tokens - 1
                and decoder.num_tokens == len(req.origin_input_ids) + len(req.output_ids))

    def pause(self) -> None:
        self.decoder.pause()
        self.paused, self.planned = True, None

    def wake(self, req: Any) -> None:
        """A paused decoder takes the tokens SGLang committed since it paused (all of them pooled but the last)."""
        catch_up(self.decoder, req)
        self.pooled, self.paused = self.decoder.cache_len, False

    def emittable(self, emitted: int) -> list[int]:
        """Committed tokens SGLang may take now, `emitted` being its output length: every token before the last
        must have its KV pooled."""
        decoder = self.decoder
        end = min(len(decoder.output), self.pooled - len(decoder.prompt) + 1)
        return decoder.output[emitted - self.emitted_before : end]


class CommitWorker(PluginWorker):
    """Where the mode adapts its widths (quadratic self-speculation, Jacobi with rejection recycling), one width per
    step for the batch (`common.width_planner.cap_widths`; SGLang's window is rectangular), priced by the step's
    measured time."""

    non_draft_tokens = 0
    lora: LoRA | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.paused_steps = 0  # decode steps run as SGLang's AR step, every request's decoder paused
        self.planner = planner_for(self.config, uniform=True)
        # whether its forwards carry recycled branches, whose count the planner measures
        self.branching = self.planner is not None and self.planner.shape.branches > 0

    def dropped(self, rid: str) -> None:
        if self.planner is not None:
            self.planner.forget([rid])

    def describe_planner(self) -> dict[str, float] | None:
        described = super().describe_planner()
        return None if described is None else {**described, "paused_steps": self.paused_steps}

    def steady_step(self, batch: Any) -> bool:
        return self.steady_again([req.rid for req in batch.reqs])

    def steady_again(self, rids: list[str]) -> bool:
        """`steady` for the batch the last step paused, its decoders' limits as planned; counted."""
        if not self.steady(rids):
            return False
        self.paused_steps += 1
        return True

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None) -> Any:
        if batch.spec_algorithm.is_none():
            return self.own_decode(batch)
        if not batch.forward_mode.is_decode():
            self.steady_batch = None
            return self.prefill(batch, on_publish)
        rids = [req.rid for req in batch.reqs]
        started = self.begin(rids)
        if self.steady_again(rids):
            return self.plain_step(batch, on_publish, started)
        states = [self.held(req) for req in batch.reqs]
        planned = [(req.rid, state.decoder) for req, state in zip(batch.reqs, states, strict=True)
                   if state is not None and isinstance(state.decoder, QuadraticSelfSpecDecoder | JacobiDecoder)]
        if self.planner is not None and planned:
            cap_widths(self.planner, [rid for rid, _ in planned], [decoder for _, decoder in planned])
        if self.pauses(batch, states):  # SGLang's AR step: its decode forward, each row's argmax
            self.paused_steps += 1
            self.steady_batch = rids
            return self.plain_step(batch, on_publish, started)
        for req, state in zip(batch.reqs, states, strict=True):
            if state is not None and state.paused:
                state.wake(req)
        width = self.step(batch, states)
        if self.branching:
            self.planner.branched([decoder.branches_planned for _, decoder in planned if decoder.draft_cap])
        committed = [state.emittable(len(req.output_ids)) for req, state in zip(batch.reqs, states, strict=True)]
        logprobs = emitted_logprobs(batch.reqs, states, committed)
        self.observe(len(states) * width, 1, started)  # drafting: the windows' path, not SGLang's decode step
        return self.result(batch, committed, on_publish, logprobs)

    def pauses(self, batch: Any, states: list[PooledDecoder | None]) -> bool:
        """Whether every request of the step is held at no draft and paused (pausing those not yet,
        `PooledDecoder.pausable`), so that the step is SGLang's own AR step: no window planned, no row digested.
        Where SGLang replays decode graphs captured for our window's width (`decodes_plainly`) nothing pauses."""
        if (self.planner is None or not self.decodes_plainly
                or not all(state is not None and getattr(state.decoder, "draft_cap", None) == 0 for state in states)):
            return False
        fresh = [row for row, state in enumerate(states) if not state.paused]
        lens = batch.seq_lens.tolist() if fresh else []
        if not all(states[row].pausable(batch.reqs[row], lens[row]) for row in fresh):
            return False
        for row in fresh:
            states[row].pause()
        return True

    def step(self, batch: Any, states: list[PooledDecoder | None], scratch: bool = False) -> int:
        """One forward of every given request's window (None: padding only), in SGLang's reserved slots or,
        during a prefill, in scratch slots freed right after; its width (rows per request)."""
        windows = [None if state is None else state.window() for state in states]
        width = max([1, *(w.num_tokens for w in windows if w is not None)])
        starts = torch.tensor([int(n) if state is None else state.pooled
                               for n, state in zip(batch.seq_lens.tolist(), states, strict=True)])
        if not scratch and self.plain(batch, windows, starts):  # a plain AR step for every request
            self.check_reserved(batch, starts + 1)
            logits = self.run_decode(batch, torch.tensor([0 if w is None else int(w.token_ids[0]) for w in windows]))
        else:
            logits = self.forward_windows(batch, windows, width, starts, scratch)
        digesting = [(row, state, window) for row, (state, window) in enumerate(zip(states, windows, strict=True))
                     if state is not None and state.planned is not None]
        if digesting:
            rows = [row * width + window.logit_rows for row, _, window in digesting]
            apply_rows([state.decoder for _, state, _ in digesting],
                       rows_of(logits.flatten(0, 1), torch.cat(rows)),
                       [len(r) for r in rows], margins=False)
        note_logprobs(states, windows, logits)
        for state, window in zip(states, windows, strict=True):
            if state is not None:
                state.digested(window)
        return width

    def forward_windows(self, batch: Any, windows: list[Forward | None], width: int, starts: torch.Tensor,
                        scratch: bool) -> torch.Tensor:
        """The windows laid out [bs, width] (tokens, positions, visibility) from each `starts`, forwarded with their
        adapter rows; logits [bs, width, V]."""
        tokens = torch.zeros(len(windows), width, dtype=torch.long)
        positions = starts[:, None] + torch.arange(width)
        # Causal by default (padding rows, past a window's, see it: their outputs and KV are never read).
        visible = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(windows), 1, 1)
        if present := [(row, window) for row, window in enumerate(windows) if window is not None]:
            rows = torch.tensor([row for row, _ in present])
            valid = torch.arange(width) < torch.tensor([window.num_tokens for _, window in present])[:, None]
            for values, field in ((tokens, "token_ids"), (positions, "positions")):
                placed = values[rows]
                placed[valid] = torch.cat([getattr(window, field) for _, window in present]).to(values.dtype)
                values[rows] = placed
        for row, window in present:
            if window.attention is not Attention.CAUSAL:
                visible[row, : window.num_tokens, : window.num_tokens] = window.visibility()
        locations, slots = self.scratch(batch, starts, width) if scratch else (None, None)
        if slots is None:
            self.check_reserved(batch, starts + width)
        try:
            with self.adapter(windows, width):
                return self.run_window(batch, tokens, visible, positions, starts, locations)
        finally:
            if slots is not None:
                self.token_to_kv_pool_allocator.free(slots.flatten())

    def plain(self, batch: Any, windows: list[Forward | None], starts: torch.Tensor) -> bool:
        """Whether the step is every request's one causal token, unadapted, right after the KV SGLang counts: SGLang's
        own decode forward runs it (`decodes_plainly`), as a plain AR step, not a one-row window with a custom mask."""
        return (self.decodes_plainly and torch.equal(starts, batch.seq_lens.cpu().long())
                and all(window is None or (window.num_tokens == 1 and window.attention is Attention.CAUSAL
                                           and window.adapter is None and int(window.positions[0]) == int(start))
                        for window, start in zip(windows, starts.tolist(), strict=True)))

    def adapter(self, windows: list[Forward | None], width: int) -> AbstractContextManager:
        """The draft adapter (`draft_adapter`, loaded onto the served model's modules once) on for the rows of the
        windows that ask for it (`Forward.adapter_rows`, every row of the window where None), as indices of the
        flattened [bs * width] tokens `run_window` forwards; nothing where no window asks."""
        rows = [row * width + (torch.arange(window.num_tokens) if window.adapter_rows is None else window.adapter_rows)
                for row, window in enumerate(windows) if window is not None and window.adapter is not None]
        if not rows:
            return nullcontext()
        if self.lora is None:
            self.lora = LoRA(self.model_runner.model, self.config.draft_adapter)
        return self.lora.enabled(torch.cat(rows))

    def scratch(self, batch: Any, starts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """KV locations for a window from each `starts` and the fresh slots they take past SGLang's tokens
        (evicting cached prefixes as SGLang's own allocations do). The fresh slots are entered in SGLang's table,
        whose later allocation overwrites the entries; rows before the end of SGLang's tokens rewrite the KV they
        already have."""
        slots = alloc_token_slots(batch.tree_cache, len(starts) * width).view(len(starts), width)
        device = slots.device
        physical = starts[:, None].to(device) + torch.arange(width, device=device)
        table, rows = self.req_to_token_pool.req_to_token, batch.req_pool_indices[:, None].long()
        fresh = physical >= batch.seq_lens[:, None].to(device)
        locations = torch.where(fresh, slots, table[rows, physical].to(slots.dtype))
        table[rows, physical] = locations.to(table.dtype)
        return locations, slots

    def check_reserved(self, batch: Any, ends: torch.Tensor) -> None:
        """Windows must end inside the KV SGLang allocated for each request this step."""
        for req, end in zip(batch.reqs, ends.tolist(), strict=True):
            if end > req.kv.kv_allocated_len:
                raise RuntimeError(f"a window runs to position {end}, past the {req.kv.kv_allocated_len} KV slots "
                                   "SGLang reserved (speculative_num_draft_tokens too small for the mode)")

    def prefill(self, batch: Any, on_publish: Any) -> Any:
        """SGLang's prefill, whose last-row logits the decoders of requests completing their prompt digest; then
        windows in scratch slots until each has a token for SGLang (their KV is recomputed later).

        A retracted request comes back as a prefill of its prompt and output so far and keeps its decoder."""
        result = self._target_worker.forward_batch_generation(batch, is_verify=True)
        logits = result.logits_output.next_token_logits
        lengths = batch.seq_lens.tolist()
        states: list[PooledDecoder | None] = []
        for row, (req, length) in enumerate(zip(batch.reqs, lengths, strict=True)):
            prompt = list(req.origin_input_ids) + list(req.output_ids)
            state = self.held(req)
            if state is not None and state.paused:  # retracted while paused
                state.wake(req)
            if length == len(prompt) and state is None:
                limits = Limits(max_tokens=req.sampling_params.max_new_tokens - len(req.output_ids),
                                context=self.model_runner.model_config.context_len)
                decoder = make_decoder(self.mode, self.config, prompt, sampling_of(req, adjustments=True), limits)
                decoder.grammar = own_grammar(req)
                forward = decoder.next_forward()
                decoder.apply(logits[row][None][forward.logit_rows - (len(prompt) - 1)].float().cpu())
                state = PooledDecoder(decoder, len(prompt), len(req.output_ids), asked=asked(req), logged=len(prompt))
                if state.asked is not None:  # the prompt's last row predicts the first token
                    state.carried = (len(prompt), logits[row].clone())
                    note_logprobs([state], [None], None)
                self.keep(req, state)
            states.append(state if length == len(prompt) else None)
        self.settle(states, lengths)
        while any(waiting := [s if s is not None and not s.emittable(len(req.output_ids)) else None
                              for req, s in zip(batch.reqs, states, strict=True)]):
            self.step(batch, waiting, scratch=True)
            self.settle(states, lengths)
        first = [[0] if s is None else s.emittable(len(req.output_ids))[:1]
                 for req, s in zip(batch.reqs, states, strict=True)]
        runs = emitted_logprobs(batch.reqs, states, first)
        return self.prefill_result(batch, result, torch.tensor([run[0] for run in first], device=self.device),
                                   on_publish, None if runs is None else [(run or [MISSING])[0] for run in runs])

    @staticmethod
    def settle(states: list[PooledDecoder | None], lengths: list[int]) -> None:
        """After a prefill (and after each scratch window) the pool holds a request's first `length` tokens; its
        decoder may count fewer as cached. A finished decoder (retracted after it committed its last token) plans
        no window: all its tokens but the last count, as in `PooledDecoder.window`."""
        for state, length in zip(states, lengths, strict=True):
            if state is not None:
                decoder = state.decoder
                state.pooled = min(length, decoder.num_tokens - 1 if decoder.finished else decoder.cache_len)


def own_grammar(req: Any) -> Any:
    """A committing decoder's grammar: a fresh copy of the request's SGLang grammar object (which SGLang advances
    over the tokens it is handed, behind the decoder), past the output so far (a retracted request's); None where
    the request has no constraint."""
    if req.grammar is None:
        return None
    grammar = req.grammar.copy()
    for token in req.output_ids:
        grammar.accept_token(token)
    return grammar


def note_logprobs(states: list[PooledDecoder | None], windows: list[Forward | None], logits: torch.Tensor | None
                  ) -> None:
    """Entries for the committed tokens of requests that ask for logprobs, from the rows of the step's windows
    [bs, W, V] that predict them, or the row carried from an earlier one; the next token's row is carried on."""
    picks: list[tuple[PooledDecoder, int, int]] = []  # state, position, token
    rows: list[torch.Tensor] = []
    for row, (state, window) in enumerate(zip(states, windows, strict=True)):
        if state is None or state.asked is None:
            continue
        tokens = state.decoder.tokens
        named = LogprobRows([None] * (len(tokens) - state.logged), None) if window is None else (
            logprob_rows(window, tokens, state.logged, len(tokens) - state.logged))
        for position, index in enumerate(named.rows, start=state.logged):
            if index is not None:
                picks.append((state, position, tokens[position]))
                rows.append(logits[row, index])
            elif state.carried is not None and state.carried[0] == position:
                picks.append((state, position, tokens[position]))
                rows.append(state.carried[1])
        if named.next_row is not None:
            state.carried = (len(tokens), logits[row, named.next_row].clone())
    found = entries(torch.stack(rows), [token for *_, token in picks], [state.asked for state, *_ in picks]
                    ) if picks else []
    for (state, position, _), entry in zip(picks, found, strict=True):
        state.logprobs[position] = entry
    for state in {id(s): s for s, *_ in picks}.values():
        while state.logged in state.logprobs:
            state.logged += 1


def emitted_logprobs(reqs: list[Any], states: list[PooledDecoder | None], emitted: list[list[int]]
                     ) -> list[list[Entry]] | None:
    """The entries of the tokens each request emits now (taken out of its book), None if no request asks."""
    if not any(s is not None and s.asked is not None for s in states):
        return None
    runs: list[list[Entry]] = []
    for req, state, tokens in zip(reqs, states, emitted, strict=True):
        start = len(req.origin_input_ids) + len(req.output_ids)
        asks = state is not None and state.asked is not None
        runs.append([state.logprobs.pop(start + j, MISSING) for j in range(len(tokens))] if asks else [])
    return runs
