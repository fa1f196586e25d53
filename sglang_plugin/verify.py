"""Lossless modes on SGLang: each decode step forwards `[seed, drafts]` per request (chain-causal) and verifies
it with `common.acceptance` (greedy requests from one batched argmax and one batched match); the unaccepted tail's
KV is simply overwritten next step.

Prefill and extend batches run as SGLang runs them but without its sampler: a request completing its prompt draws
its first token with its own generator (`prefill`). Which drafts a request carries is the mode's business
(`sglang_plugin.drafters`), which may run extra windows of its own; how many, where the config adapts, the width
planner's (`common.width_planner`: one width for the batch, SGLang's verify window being rectangular).
"""

from typing import Any

import torch

from parallel_decoding.common.acceptance import accept_greedy_batch, verify
from parallel_decoding.common.grammar import constrain
from parallel_decoding.common.penalties import adjusted
from parallel_decoding.common.sampling import SamplingParams, choose
from parallel_decoding.common.width_planner import planner_for
from parallel_decoding.common.window import causal_forward
from parallel_decoding.sglang_plugin.drafters import make_drafter
from parallel_decoding.sglang_plugin.drafts import RequestState
from parallel_decoding.sglang_plugin.logprobs import MISSING, Entry, asked, entries
from parallel_decoding.sglang_plugin.worker import PluginWorker, sampling_of


def constrained(reqs: list[Any], drafts: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
    """The verify forward's logits [bs, width, vocab] with each structured-output request's chain masked by its
    grammar (SGLang's object, which its scheduler advances over what the step commits; `common.grammar`)."""
    grammars = [req.grammar for req in reqs]
    return logits if all(g is None for g in grammars) else constrain(grammars, drafts, logits)


def penalised(reqs: list[Any], states: list[RequestState], tokens: torch.Tensor, logits: torch.Tensor,
              mask_token_id: int | None) -> torch.Tensor:
    """The logits [bs, width, vocab] of chains `tokens` [bs, width] (each a request's last token and its drafts)
    with the penalties, logit bias and minimum length of the requests that set them: row j with the request's output
    and the chain's tokens before it as its history (`common.penalties`, SGLang's definitions), so a verified token is
    drawn from what SGLang's AR draws it from."""
    rows = [row for row, state in enumerate(states) if state.sampling.adjusts_logits]
    if not rows:
        return logits
    logits = logits.float().clone()
    width = tokens.shape[1]
    for row in rows:
        req = reqs[row]
        start = len(req.origin_input_ids) + len(req.output_ids) - 1
        chain = causal_forward(tokens[row].tolist(), start, list(range(width)))
        logits[row] = adjusted(logits[row], states[row].sampling, req.origin_input_ids, req.output_ids, chain,
                               mask_token_id).to(logits.device)
    return logits


class VerifyWorker(PluginWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drafter = make_drafter(self.mode, self.config, self)
        self.planner = planner_for(self.config, uniform=True)

    @property
    def masks(self) -> int | None:
        """The mask token a chain may carry (WeDLM-drafted speculation's slots), in no row's history."""
        return getattr(self.config, "mask_token_id", None) if self.mode == "wedlm_spec" else None

    def dropped(self, rid: str) -> None:
        if self.planner is not None:
            self.planner.forget([rid])

    def describe_planner(self) -> dict[str, float] | None:
        described = super().describe_planner()
        return None if described is None else {**described, "paused_request_steps": self.drafter.paused_request_steps}

    def state(self, req: Any) -> RequestState:
        state = self.held(req)
        if state is None:
            sampling = sampling_of(req, adjustments=True, resumed=False)
            state = RequestState(sampling, sampling.generator())
            self.keep(req, state)
        return state

    def steady_step(self, batch: Any) -> bool:
        rids = [req.rid for req in batch.reqs]
        if self.steady_batch != rids:  # not steady, told at the step's `steady_again`
            return False
        return self.steady_again(rids, self.drafter.limits(batch.reqs, [self.state(req) for req in batch.reqs]))

    def steady_again(self, rids: list[str], limits: list[int]) -> bool:
        """`steady`, given the requests' limits (which shrink as requests near `max_new_tokens`), counted."""
        if not self.steady(rids, limits):
            return False
        self.drafter.paused_request_steps += len(rids) if self.drafter.pauses else 0
        return True

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None) -> Any:
        if batch.spec_algorithm.is_none():
            return self.own_decode(batch)
        if not batch.forward_mode.is_decode():
            self.steady_batch = None
            return self.prefill(batch, on_publish)
        rids = [req.rid for req in batch.reqs]
        started = self.begin(rids)
        states = [self.state(req) for req in batch.reqs]
        limits = self.drafter.limits(batch.reqs, states)
        if self.steady_again(rids, limits):
            return self.plain_step(batch, on_publish, started)
        seeds = [req.output_ids[-1] for req in batch.reqs]
        if self.planner is not None:
            seeded = [state.sampling.seed is not None for state in states]
            limits = self.planner.plan(rids, limits, seeded).tolist()
        drafts = self.drafter.draft(batch, batch.reqs, states, seeds, limits)
        iterated = [state.decoder is None or state.decoder.iterated for state in states]  # `Decoder.iterated`
        width = 1 + max(len(d.tokens) for d in drafts)
        tokens = torch.tensor([[seed, *d.tokens] + [seed] * (width - 1 - len(d.tokens))
                               for seed, d in zip(seeds, drafts, strict=True)])
        if width == 1 and self.decodes_plainly:  # a plain AR step for every request
            logits = self.run_decode(batch, tokens[:, 0])
        else:
            logits = self.run_window(batch, tokens, torch.ones(width, width, dtype=torch.bool).tril().expand(
                len(seeds), -1, -1))
        logits = penalised(batch.reqs, states, tokens, logits, self.masks)
        logits = constrained(batch.reqs, [d.tokens for d in drafts], logits)
        predicted = logits.argmax(-1).cpu()
        greedy = accept_greedy_batch([d.tokens for d in drafts], predicted)
        committed = [run if state.sampling.greedy else
                     verify(torch.tensor(d.tokens, dtype=torch.long), logits[row, : len(d.tokens) + 1].float().cpu(),
                            state.sampling, state.generator, d.probs)
                     for row, (state, d, run) in enumerate(zip(states, drafts, greedy, strict=True))]
        self.drafter.after_verify(batch.reqs, states, logits, predicted, drafts, committed)
        logprobs = self.chain_logprobs(batch, logits, committed)
        if self.planner is not None:
            self.planner.record(rids, [d.drafted for d in drafts],
                                [min(len(run) - 1, d.drafted) for run, d in zip(committed, drafts, strict=True)],
                                iterated)
            draft_rows = self.drafter.forwarded_rows
            self.observe(tokens.numel() + draft_rows, int(width > 1 or draft_rows > 0), started)
            if width == 1 and not draft_rows and self.decodes_plainly and logprobs is None \
                    and self.leaves_plain(batch.reqs, states):
                self.steady_batch = rids
        return self.result(batch, committed, on_publish, logprobs)

    def leaves_plain(self, reqs: list[Any], states: list[RequestState]) -> bool:
        """Whether steps like this plain one need no per-request work: every request greedy, its logits as the
        model gives them (no penalty, bias or grammar), its decoder, where it follows, paused."""
        return all(state.sampling.greedy and not state.sampling.adjusts_logits and req.grammar is None
                   and (state.paused or not self.drafter.pauses) for req, state in zip(reqs, states, strict=True))

    @staticmethod
    def chain_logprobs(batch: Any, logits: torch.Tensor, committed: list[list[int]]) -> list[list[Entry]] | None:
        """The committed runs' logprobs for the requests that ask: the chain's row j predicts token j."""
        asks = [asked(req) for req in batch.reqs]
        if not any(asks):
            return None
        picks = [(row, j) for row, (ask, run) in enumerate(zip(asks, committed, strict=True)) if ask
                 for j in range(len(run))]
        found = entries(logits[[r for r, _ in picks], [j for _, j in picks]],
                        [committed[r][j] for r, j in picks], [asks[r] for r, _ in picks])
        runs: list[list[Entry]] = [[] for _ in committed]
        for (row, _), entry in zip(picks, found, strict=True):
            runs[row].append(entry)
        return runs

    def prefill(self, batch: Any, on_publish: Any) -> Any:
        """SGLang's prefill; a request completing its prompt draws its first token from the last row with the
        generator its later steps sample with, so a seeded request gives the same tokens in any batch (SGLang's own
        sampler applies `sampling_seed` only under deterministic inference). Partial prefills emit nothing."""
        result = self._target_worker.forward_batch_generation(batch, is_verify=True)
        rows = result.logits_output.next_token_logits[:, None]
        complete = [length == len(req.origin_input_ids) + len(req.output_ids)
                    for req, length in zip(batch.reqs, batch.seq_lens.tolist(), strict=True)]
        states = [self.state(req) if done else RequestState(SamplingParams(), torch.Generator())
                  for req, done in zip(batch.reqs, complete, strict=True)]
        last = torch.tensor([[(req.output_ids or req.origin_input_ids)[-1]] for req in batch.reqs])
        rows = penalised(batch.reqs, states, last, rows, self.masks)
        logits = constrained(batch.reqs, [[] for _ in batch.reqs], rows)[:, 0]
        first = []
        for row, (done, state) in enumerate(zip(complete, states, strict=True)):
            if not done:
                first.append(0)
                continue
            first.append(int(choose(logits[row : row + 1].float().cpu(), state.sampling, state.generator)[0]))
        runs = self.chain_logprobs(batch, logits[:, None], [[token] for token in first])
        return self.prefill_result(batch, result, torch.tensor(first, device=self.device), on_publish,
                                   None if runs is None else [run[0] if run else MISSING for run in runs])
