"""A vLLM worker extension that reports the plugin's per-request state, so a server's leaks can be counted.

Serve with `--worker-extension-cls vllm_plugin.probe.StateProbe` and `VLLM_SERVER_DEV_MODE=1`, then
`POST /collective_rpc {"method": "parallel_decoding_entries"}` answers one `{table: entries}` per worker
(`parallel_decoding_width_planner`: the width planner's choices and fitted cost model).
"""

from typing import Any


class StateProbe:
    """Mixed into vLLM's worker class by `--worker-extension-cls`."""

    model_runner: Any

    def parallel_decoding_entries(self) -> dict[str, int]:
        """Entries per per-request table of our proposer (empty when the engine runs no method of ours)."""
        from parallel_decoding.vllm_plugin.proposer import PluginProposer

        drafter = getattr(self.model_runner, "drafter", None)
        return drafter.entries if isinstance(drafter, PluginProposer) else {}

    def parallel_decoding_width_planner(self) -> dict:
        """The width planner's choices and cost model (`common.width_planner`; empty when the method does not
        adapt)."""
        plan = getattr(getattr(self.model_runner, "drafter", None), "planner", None)
        return {} if plan is None else plan.describe()
