"""Make WeDLM, Nemotron-Labs-Diffusion and Huginn checkpoints loadable in vLLM without their remote code: the
configs of `common.checkpoint_configs`, the architectures as stock vLLM classes (`vllm_plugin.models`) or, for
Huginn's recurrent depth, our own (`vllm_plugin.raven`). The registration is additive: vLLM knows none of these
names, so nothing it served before changes.
"""

from parallel_decoding.common.checkpoint_configs import register_configs
from parallel_decoding.common.models.raven import ARCHITECTURE as RAVEN_ARCHITECTURE


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (lazily imported); idempotent."""
    from vllm import ModelRegistry

    register_configs()
    ModelRegistry.register_model("WeDLMForCausalLM", "parallel_decoding.vllm_plugin.models:WeDLMForCausalLM")
    ModelRegistry.register_model("NemotronLabsDiffusionModel",
                                 "parallel_decoding.vllm_plugin.models:NemotronLabsDiffusionForCausalLM")
    ModelRegistry.register_model(RAVEN_ARCHITECTURE, "parallel_decoding.vllm_plugin.raven:RavenForCausalLM")
