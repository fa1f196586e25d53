"""Make WeDLM and Nemotron-Labs-Diffusion checkpoints loadable in vLLM without their remote code: the configs of
`common.checkpoint_configs`, the architectures as stock vLLM classes (`vllm_plugin.models`). The registration is
additive: vLLM knows none of these names, so nothing it served before changes.
"""

from common.checkpoint_configs import register_configs


def register() -> None:
    """Register the configs with transformers and the architectures with vLLM (lazily imported); idempotent."""
    from vllm import ModelRegistry

    register_configs()
    ModelRegistry.register_model("WeDLMForCausalLM", "vllm_plugin.models:WeDLMForCausalLM")
    ModelRegistry.register_model("NemotronLabsDiffusionModel", "vllm_plugin.models:NemotronLabsDiffusionForCausalLM")
