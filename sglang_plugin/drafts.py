"""What a lossless mode's step carries per request on SGLang: the drafts its drafter proposes, and what a request
keeps between steps."""

from dataclasses import dataclass

import torch

from parallel_decoding.common.decoder import Decoder
from parallel_decoding.common.sampling import SamplingParams


@dataclass
class Drafts:
    """One request's drafts for this step and, when they were sampled, the proposal they were drawn from."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    verifies: int | None = None  # how many of `tokens` are drafts (None: all; WeDLM-drafted speculation's mask slots)

    @property
    def drafted(self) -> int:
        return len(self.tokens) if self.verifies is None else self.verifies


@dataclass
class RequestState:
    """A request's sampling, its generator, and the `common/` decoder of a drafter that follows the verifications
    (Jacobi, WeDLM-drafted speculation; None for the others), `paused` while it follows none of the request's plain
    AR steps (`sglang_plugin.drafters.FollowingDrafter`)."""

    sampling: SamplingParams
    generator: torch.Generator
    decoder: Decoder | None = None
    paused: bool = False
