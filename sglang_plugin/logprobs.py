"""`return_logprob` with our modes on SGLang: for each token a step emits, the log-probability and top
`top_logprobs_num` that SGLang's sampler reports for AR decoding (the log-softmax of the logits over the request's
temperature, 1 for greedy), read from the rows of our own forwards that predict it (`common.logprob_rows`), in
the layout SGLang's result processing reads (per request a run of the step's stride)."""

from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput


@dataclass(frozen=True)
class Asked:
    """What a request asks for: logprobs under `temperature`, and its `top` most likely tokens'."""

    temperature: float
    top: int


@dataclass(frozen=True)
class Entry:
    """One emitted token's logprob and its position's top logprobs."""

    logprob: float
    top_values: list[float]
    top_ids: list[int]


MISSING = Entry(-9999.0, [], [])  # a token no forward of ours predicted (never, for our modes)


def asked(req: Any) -> Asked | None:
    """The request's logprob settings, None if it asks for none."""
    if not req.return_logprob:
        return None
    temperature = float(req.sampling_params.temperature)
    return Asked(temperature if temperature > 0 else 1.0, int(req.logprob.top_logprobs_num))


def entries(rows: torch.Tensor, tokens: list[int], asks: list[Asked]) -> list[Entry]:
    """The entries of `tokens`, each predicted by its row of `rows` [n, V] under its request's settings: one pass
    over all rows, one copy to the host."""
    if not tokens:
        return []
    temperatures = torch.tensor([a.temperature for a in asks], device=rows.device)
    logprobs = (rows.float() / temperatures[:, None]).log_softmax(-1)
    logprobs.clamp_(min=torch.finfo(logprobs.dtype).min)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=rows.device)[:, None])[:, 0].tolist()
    top = max(a.top for a in asks)
    values, ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0], logprobs[:, :0].long())
    values, ids = values.tolist(), ids.tolist()
    return [Entry(c, v[: a.top], i[: a.top]) for c, v, i, a in zip(chosen, values, ids, asks, strict=True)]


def decode_output(emitted: list[list[Entry]], stride: int, device: torch.device) -> LogitsProcessorOutput:
    """A decode step's logprobs as SGLang's speculative path lays them out: [requests, stride] values, flat top
    lists (a request asking for none has empty runs)."""
    values = torch.zeros(len(emitted), stride, device=device)
    top: list[Entry] = [MISSING] * (len(emitted) * stride)
    for row, run in enumerate(emitted):
        for j, entry in enumerate(run):
            values[row, j], top[row * stride + j] = entry.logprob, entry
    output = LogitsProcessorOutput(next_token_logits=None, next_token_logprobs=values)
    set_top(output, top)
    return output


def fill_prefill(output: LogitsProcessorOutput, first: list[Entry]) -> None:
    """The first emitted tokens' logprobs on a prefill's output ([requests] values, a top list each)."""
    output.next_token_logprobs = torch.tensor([entry.logprob for entry in first])
    set_top(output, first)


def set_top(output: LogitsProcessorOutput, top: list[Entry]) -> None:
    """Top logprobs per emitted slot, as tensors (SGLang copies each to a list)."""
    output.next_token_top_logprobs_val = [torch.tensor(e.top_values, dtype=torch.float32) for e in top]
    output.next_token_top_logprobs_idx = [torch.tensor(e.top_ids, dtype=torch.long) for e in top]
