"""vLLM adapter: `--speculative-config '{"method": "diffusion_self" | "jacobi", ...}'` through an installed plugin.

Only the front-end translation of `--speculative-config` is installed in every process; it passes every other
method through untouched. The worker and scheduler pieces load only when one of our methods is selected.
"""


def register() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it once in every process it starts."""
    from vllm_plugin.config import install

    install()
