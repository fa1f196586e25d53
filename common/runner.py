"""The reference runner: drives any decoder on a transformers causal LM, with a KV cache or recomputing."""

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from parallel_decoding.common.attention import additive_mask
from parallel_decoding.common.decoder import Decoder
from parallel_decoding.common.runner_widths import PlannedSteps, StepClock
from parallel_decoding.common.width_planner import WidthPlanner
from parallel_decoding.common.window import Forward, Outcome

Adapter = Callable[..., AbstractContextManager]  # called with the rows it applies to, or with nothing: every row


@dataclass
class Step:
    """One forward the runner ran: what the decoder asked for, what it committed, and the cache after it (None
    when recomputing)."""

    forward: Forward
    outcome: Outcome
    cache: DynamicCache | None


@dataclass
class Result:
    """What one request produced and what it cost."""

    token_ids: list[int]
    forwards: int
    tokens_per_forward: float
    p_cache: float
    seconds: float
    margins: list[float]


class ReferenceRunner:
    """Runs decoders one request at a time.

    With `use_cache` the cache holds the decoder's committed KV and is cropped after every forward; without
    it every forward recomputes the committed prefix from scratch (the oracle for the cached path).
    `adapters` maps a forward's adapter name (e.g. NLD's draft LoRA) to a context that enables it. With a
    `planner` (`common.runner_widths`), a decoder that takes a cap on its drafts gets the planner's before each step,
    the planner timing each step by the clock, or by `clock` where given (`PlannedSteps`).
    """

    def __init__(self, model: PreTrainedModel, use_cache: bool = True, adapters: dict[str, Adapter] | None = None,
                 planner: WidthPlanner | None = None, clock: StepClock | None = None):
        self.model = model
        self.use_cache = use_cache
        self.adapters = adapters or {}
        self.planner = planner
        self.clock = clock
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    def run(self, decoder: Decoder) -> Result:
        start = time.perf_counter()
        for _ in self.steps(decoder):
            pass
        return Result(
            token_ids=list(decoder.output),
            forwards=decoder.forwards,
            tokens_per_forward=decoder.tokens_per_forward,
            p_cache=decoder.p_cache,
            seconds=time.perf_counter() - start,
            margins=decoder.decision_margins,
        )

    def steps(self, decoder: Decoder) -> Iterator[Step]:
        """Run `decoder` to the end, yielding each forward's `Step`."""
        cache = DynamicCache(config=self.model.config) if self.use_cache else None
        planned = None
        if self.planner is not None and hasattr(decoder, "cap"):
            planned = PlannedSteps(self.planner, decoder, self.clock)
        try:
            while not decoder.finished:
                if planned is not None:
                    planned.begin()
                forward = decoder.next_forward()
                with self.adapter(forward.adapter)(*self.adapter_rows(forward, decoder, cache)):
                    logits = self.logits(forward, decoder, cache)
                outcome = decoder.apply(logits)
                if planned is not None:
                    planned.forwarded(forward.num_tokens, outcome)
                if cache is not None and cache.get_seq_length() > decoder.cache_len:
                    cache.crop(decoder.cache_len - cache.get_seq_length())
                yield Step(forward, outcome, cache)
        finally:
            if planned is not None:
                planned.end()

    @staticmethod
    def adapter_rows(forward: Forward, decoder: Decoder, cache: DynamicCache | None) -> tuple[torch.Tensor, ...]:
        """The rows a row-scoped adapter applies to, as indices of the model's input (past a recomputed prefix);
        nothing where it applies to every row."""
        if forward.adapter_rows is None:
            return ()
        return (forward.adapter_rows + (decoder.cache_len if cache is None else 0),)

    def adapter(self, name: str | None) -> Adapter:
        """The context a forward's adapter needs; a forward asking for one the runner lacks is an error."""
        if name is None:
            return nullcontext
        if name not in self.adapters:
            raise KeyError(f"the forward needs adapter {name!r}, but the runner was given {sorted(self.adapters)}")
        return self.adapters[name]

    @torch.inference_mode()
    def logits(self, forward: Forward, decoder: Decoder, cache: DynamicCache | None) -> torch.Tensor:
        """Logits of the forward's `logit_rows`, float32 on CPU."""
        prefix = decoder.cache_len
        ids, positions = forward.token_ids, forward.positions
        if cache is None:
            ids = torch.cat([torch.tensor(decoder.tokens[:prefix], dtype=torch.long), ids])
            positions = torch.cat([torch.arange(prefix), positions])
        mask = additive_mask(forward, prefix, self.dtype, recompute=cache is None)
        out = self.model(
            input_ids=ids[None].to(self.device),
            position_ids=positions[None].to(self.device),
            attention_mask=mask.to(self.device),
            past_key_values=cache,
            use_cache=cache is not None,
        )
        rows = forward.logit_rows + (prefix if cache is None else 0)
        return out.logits[0, rows.to(self.device)].float().cpu()
