"""Make WeDLM, Nemotron-Labs-Diffusion and Huginn checkpoints loadable in vLLM without their remote code: the
configs of `common.checkpoint_configs`, the architectures as stock vLLM classes (`vllm_plugin.models`) or, for
Huginn's recurrent depth, our own (`vllm_plugin.raven`). The registration is additive: vLLM knows none of these
names, so nothing it served before changes.
"""

from common.checkpoint_configs import register_configs
from common.models.raven import ARCHITECTURE as RAVEN_ARCHITECTURE


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (lazily imported); idempotent."""
    from vllm import ModelRegistry

    register_configs()
    ModelRegistry.register_model("WeDLMForCausalLM", "vllm_plugin.models:WeDLMForCausalLM")
    ModelRegistry.register_model("NemotronLabsDiffusionModel", "vllm_plugin.models:NemotronLabsDiffusionForCausalLM")
    ModelRegistry.register_model(RAVEN_ARCHITECTURE, "vllm_plugin.raven:RavenForCausalLM")
