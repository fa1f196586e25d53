"""A vLLM worker extension that reports the plugin's per-request state, so a server's leaks can be counted.

Serve with `--worker-extension-cls vllm_plugin.probe.StateProbe` and `VLLM_SERVER_DEV_MODE=1`, then
`POST /collective_rpc {"method": "parallel_decoding_entries"}` answers one `{table: entries}` per worker.
"""

from typing import Any


class StateProbe:
    """Mixed into vLLM's worker class by `--worker-extension-cls`."""

    model_runner: Any

    def parallel_decoding_entries(self) -> dict[str, int]:
        """Entries per per-request table of our proposer (empty when the engine runs no method of ours)."""
        from vllm_plugin.proposer import PluginProposer

        drafter = getattr(self.model_runner, "drafter", None)
        return drafter.entries if isinstance(drafter, PluginProposer) else {}
