"""vLLM adapter: `--speculative-config '{"method": M, ...}'`, M one of `diffusion_self`, `jacobi`, `wedlm`,
`diffusion`, `huginn`.

Installed in every process: the front-end translation of `--speculative-config` (every other method passes
through untouched), the refusal of per-request settings our method would not apply, and the WeDLM checkpoint names
vLLM lacks. The worker and scheduler pieces load only when
one of our methods is selected.
"""


def register() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it once in every process it starts."""
    from parallel_decoding.vllm_plugin import checkpoints, config, requests

    config.install()
    requests.install()
    checkpoints.register()
