"""Huginn's samplers (`ar`, `adaptive`, `wavefront`) on SGLang, each request with its own `common.huginn` decoder.

A prefill runs `num_steps` recurrences from the rows' initial latents and the decoder takes the first token from
its last row. Each decode step forwards every request's planned rows (its last token, then the wavefront) after
the KV SGLang holds, in the slots SGLang reserved, with their latents and recurrence counts staged on the model
(`sglang_plugin.models.raven`); the positions a decoder freezes are the step's tokens (possibly none), their KV
kept. Latents live in the decoders, dropped with the request (`PluginWorker.release_finished`).

A request SGLang retracts comes back as a prefill of its prompt and output, whose KV is recomputed as `ar`
computes it: its decoder takes the next token from that prefill's last row and starts its wavefront afresh.

`return_logprob`: each token's entry read from the row that chose it (the coda's readout of its position's last
latent: `ar`'s distribution at `num_steps`, the exit depth's for `adaptive` and `wavefront`), under the request's
temperature as SGLang's sampler reports AR's.
"""

from typing import Any

import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.huginn.decoder import HuginnDecoder
from parallel_decoding.common.huginn.forward import RecurrentForward, RecurrentOutput, RecurrentRows
from parallel_decoding.sglang_plugin.commit import own_grammar
from parallel_decoding.sglang_plugin.logprobs import MISSING, Entry, asked, entries
from parallel_decoding.sglang_plugin.worker import PluginWorker, sampling_of


class HuginnWorker(PluginWorker):
    non_draft_tokens = 0

    @property
    def model(self) -> Any:
        return self.model_runner.model

    def forward_batch_generation(self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None) -> Any:
        if not batch.forward_mode.is_decode():
            return self.prefill(batch, on_publish)
        return self.decode(batch, on_publish)

    def decoder(self, req: Any) -> HuginnDecoder:
        """The request's decoder, made when its first prefill starts."""
        decoder = self.held(req)
        if decoder is None:
            limits = Limits(max_tokens=req.sampling_params.max_new_tokens - len(req.output_ids),
                            context=self.model_runner.model_config.context_len - 1)
            prompt = list(req.origin_input_ids) + list(req.output_ids)
            decoder = HuginnDecoder(prompt, sampling_of(req, adjustments=True), limits, self.config, self.model,
                                    grammar=own_grammar(req))
            self.keep(req, decoder)
        return decoder

    def prefill(self, batch: Any, on_publish: Any) -> Any:
        decoders = [self.decoder(req) for req in batch.reqs]
        self.model.rows = RecurrentRows.of([
            self.unplanned(decoder, start, count)
            for decoder, start, count in zip(decoders, batch.prefix_lens, batch.extend_lens, strict=True)])
        result = self._target_worker.forward_batch_generation(batch, is_verify=True)
        logits = result.logits_output.next_token_logits.float().cpu()
        first, committed = [], []
        for row, (req, decoder, length) in enumerate(zip(batch.reqs, decoders, batch.seq_lens.tolist(), strict=True)):
            if length < len(req.origin_input_ids) + len(req.output_ids):
                first.append(0)  # a prompt chunk: SGLang takes no token from it
                committed.append([])
                continue
            if not decoder.output:
                committed.append(decoder.apply(decoder.plan(), RecurrentOutput(None, logits[row][None], None)))
            else:
                committed.append(decoder.resume(logits[row][None]))
            first.append(committed[-1][0])
        runs = chosen_logprobs(batch.reqs, decoders, committed, logits[:, None])
        return self.prefill_result(batch, result, torch.tensor(first, device=self.device), on_publish,
                                   None if runs is None else [(run or [MISSING])[0] for run in runs])

    def unplanned(self, decoder: HuginnDecoder, start: int, count: int) -> RecurrentForward:
        """`num_steps` recurrences from the rows' initial latents (SGLang's input ids are the tokens)."""
        return RecurrentForward(torch.zeros(count, dtype=torch.long), start, decoder.latents(start, count),
                                self.config.num_steps)

    def decode(self, batch: Any, on_publish: Any) -> Any:
        decoders = [self.held(req) for req in batch.reqs]
        forwards = []
        for decoder, length in zip(decoders, batch.seq_lens.tolist(), strict=True):
            if decoder.cache_len != length:
                raise RuntimeError(f"a Huginn decoder counts {decoder.cache_len} cached tokens, SGLang {length}")
            forwards.append(decoder.plan())
        width = max(f.token_ids.numel() for f in forwards)
        tokens = torch.zeros(len(forwards), width, dtype=torch.long)
        visible = torch.eye(width, dtype=torch.bool).repeat(len(forwards), 1, 1)
        staged = []
        for row, forward in enumerate(forwards):
            n = forward.token_ids.numel()
            tokens[row, :n], visible[row, :n, :n] = forward.token_ids, torch.ones(n, n, dtype=torch.bool).tril()
            staged.append(forward)
            if n < width:  # padding rows, each seeing itself only
                staged.append(RecurrentForward(torch.zeros(width - n, dtype=torch.long), 0,
                                               torch.zeros(width - n, self.model.config.n_embd), 1))
        for req, length in zip(batch.reqs, batch.seq_lens.tolist(), strict=True):
            if length + width > req.kv.kv_allocated_len:
                raise RuntimeError(f"a Huginn window runs to position {length + width}, past the "
                                   f"{req.kv.kv_allocated_len} KV slots SGLang reserved")
        self.model.rows = RecurrentRows.of(staged)
        logits = self.run_window(batch, tokens, visible).float().cpu()
        last = self.model.last
        latents, embeds = (t.float().cpu().view(len(forwards), width, -1) for t in (last.latents, last.embeds))
        committed = []
        for row, (decoder, forward) in enumerate(zip(decoders, forwards, strict=True)):
            n = forward.token_ids.numel()
            out = RecurrentOutput(latents[row, :n], logits[row, :n], embeds[row, :n])
            committed.append(decoder.apply(forward, out))
        return self.result(batch, committed, on_publish, chosen_logprobs(batch.reqs, decoders, committed, logits))


def chosen_logprobs(reqs: list[Any], decoders: list[HuginnDecoder], committed: list[list[int]],
                    logits: torch.Tensor) -> list[list[Entry]] | None:
    """The entries of each request's committed tokens, read from the rows of `logits` [bs, rows, V] that chose
    them (`HuginnDecoder.picked`); None if no request asks for logprobs."""
    asks = [asked(req) for req in reqs]
    if all(a is None for a in asks):
        return None
    picks = [(row, index, token) for row, (a, decoder, tokens) in enumerate(zip(asks, decoders, committed, strict=True))
             if a is not None and tokens for index, token in zip(decoder.picked, tokens, strict=True)]
    found = iter(entries(torch.stack([logits[row, index] for row, index, _ in picks]) if picks else logits[:0, 0],
                         [token for *_, token in picks], [asks[row] for row, *_ in picks]))
    return [[next(found) for _ in tokens] if a is not None else [] for a, tokens in zip(asks, committed, strict=True)]
