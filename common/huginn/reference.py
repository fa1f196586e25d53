"""The reference runner: one Huginn request run to the end on a fresh cache."""

from dataclasses import dataclass

import torch

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.grammar import Grammar
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.decoder import HuginnDecoder
from parallel_decoding.common.huginn.forward import run_forward
from parallel_decoding.common.models.raven import KVCache, RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams


@dataclass
class HuginnResult:
    """A request's tokens, each one's log-probability under the distribution the sampler chose it from (the
    coda's readout of its position's last latent), the forwards and core passes it took, and per token the slack
    of the greedy decisions taken while it was next (`HuginnDecoder.decision_margins`)."""

    token_ids: list[int]
    logprobs: list[float]
    forwards: int
    core_passes: int
    margins: list[float]

    @property
    def core_passes_per_token(self) -> float:
        return self.core_passes / max(len(self.token_ids), 1)


def generate(model: RavenForCausalLM, prompt: list[int], config: HuginnConfig,
             sampling: SamplingParams | None = None, limits: Limits | None = None,
             grammar: Grammar | None = None) -> HuginnResult:
    """Run one request to the end on a fresh cache (the reference runner), under `grammar` where given."""
    decoder = HuginnDecoder(prompt, sampling or SamplingParams(), limits or Limits(), config, model, grammar=grammar)
    cache = KVCache(config.cache_lookup_strategy)
    logprobs: list[float] = []
    with torch.inference_mode():
        while not decoder.finished:
            forward = decoder.plan()
            out = run_forward(model, cache, forward)
            committed = decoder.apply(forward, out)
            rows = out.logits[decoder.picked].float().log_softmax(-1)
            logprobs += rows.gather(-1, torch.tensor(committed, dtype=torch.long)[:, None])[:, 0].tolist()
    return HuginnResult(decoder.output, logprobs, decoder.forwards, decoder.core_passes, decoder.decision_margins)
