"""Per-request settings `wedlm`, `diffusion`, `huginn` and quadratic `diffusion_self` do not apply (their decoders
replace vLLM's sampler and its logits processors), refused by name before a request is queued: the offline API
raises, the OpenAI server answers 400. `logprobs` they report (`vllm_plugin.logprobs`; `huginn`'s are those of the
distribution each token was chosen from), and `prompt_logprobs` from their causal prefill (all but `wedlm`).

The lossless methods are verified by vLLM's own rejection sampler, which applies them to the target."""

import functools
from typing import Any

from vllm_plugin.config import ADDITIONAL_CONFIG_KEY

# vLLM sampling parameters the committing methods do not apply, with the value that leaves them off.
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
           "min_tokens": 0, "logprobs": None, "prompt_logprobs": None, "logprob_token_ids": None,
           "structured_outputs": None, "logit_bias": None, "allowed_token_ids": None, "bad_words": None}
# What they report all the same.
REPORTED = {"logprobs", "prompt_logprobs"}


def check(method: str, params: Any, committing: bool) -> None:
    """Raise vLLM's validation error naming the first setting `method` would leave unapplied (`committing`: its
    decoder, not vLLM's sampler, picks the tokens)."""
    from vllm.exceptions import VLLMValidationError

    if not committing:
        return
    for name, neutral in NEUTRAL.items():
        if name in REPORTED and not (name == "prompt_logprobs" and method == "wedlm"):
            continue
        value = getattr(params, name, neutral)
        if value != neutral and value not in ({}, []):
            raise VLLMValidationError(f"{name} is not applied with speculative method {method}: leave it unset "
                                      f"or {neutral!r}, got {value!r}", parameter=name, value=value)


def install() -> None:
    """Wrap `InputProcessor._validate_params` (idempotent); requests to engines without our method pass through."""
    from vllm.v1.engine.input_processor import InputProcessor

    validate = InputProcessor._validate_params
    if getattr(validate, "parallel_decoding", False):
        return

    @functools.wraps(validate)
    def validate_ours(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        ours = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if ours is not None and hasattr(params, "logprobs"):
            check(ours["method"], params, ours["committing"])
        return validate(self, params, *args, **kwargs)

    validate_ours.parallel_decoding = True
    InputProcessor._validate_params = validate_ours
