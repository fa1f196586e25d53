"""A method ready to run on a checkpoint directory in the reference runner: the model and tokenizer, the method's
config completed from the checkpoint (mask token, `dlm_type`), its draft adapter switched on while drafting, and the
checkpoint's EOS ids, and the width planner where the config asks the reference runner to adapt
(`common.runner_widths`). The one factory the reference CLI, the demo, the bench and the tools build a runner with."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.draft_layout import complete_config
from parallel_decoding.common.lora import draft_adapters
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.runner_widths import reference_planner
from parallel_decoding.common.sampling import SamplingParams


@dataclass
class ReferenceSetup:
    """A loaded checkpoint with one method's completed config and a runner for it."""

    model: Any
    tokenizer: Any
    method: str
    config: Any
    runner: ReferenceRunner

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return eos_token_ids(self.model, self.tokenizer)

    def limits(self, max_tokens: int, stop_at_eos: bool = True) -> Limits:
        return Limits(max_tokens, self.eos_token_ids if stop_at_eos else ())

    def decoder(self, prompt: list[int], sampling: SamplingParams, limits: Limits) -> Decoder:
        """A fresh decoder of the method for one request."""
        return make_decoder(self.method, self.config, prompt, sampling, limits)


def reference_setup(model_dir: str | Path, method: str, settings: dict[str, Any] | str | None = None, *,
                    device: str = "cpu", dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
                    use_cache: bool = True) -> ReferenceSetup:
    """Load `model_dir` and prepare `method` with `settings` (JSON, a `.json` path or a dict) on it. Bad settings
    raise ConfigError naming the field, before the model loads."""
    config = parse_config(method, settings)
    model, tokenizer = load(model_dir, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    config = complete_config(config, model.config, lambda: tokenizer)
    runner = ReferenceRunner(model, use_cache=use_cache, adapters=draft_adapters(model, model_dir, config),
                             planner=reference_planner(config))
    return ReferenceSetup(model, tokenizer, method, config, runner)
