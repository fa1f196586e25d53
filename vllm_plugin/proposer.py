"""The base of our vLLM proposers: the method's typed config, per-request sampling, and the runner hooks."""

from typing import Any

import torch

from common.methods import parse_config
from common.sampling import SamplingParams
from vllm_plugin import cpu_kernels, runner_hooks
from vllm_plugin.config import ADDITIONAL_CONFIG_KEY

GREEDY_EPS = 1e-5
DRAFT_SEED_STRIDE = 0x9E3779B97F4A7C15


def request_sampling(params: Any) -> SamplingParams:
    """A vLLM request's sampling parameters as `common/` reads them (vLLM's near-zero temperature is greedy)."""
    temperature = params.temperature if params.temperature >= GREEDY_EPS else 0.0
    return SamplingParams(temperature=temperature, top_p=params.top_p, top_k=max(params.top_k, 0), seed=params.seed)


class PluginProposer(runner_hooks.Hooked):
    """A `custom_class` proposer driven through `runner_hooks` with the model runner in hand: its per-request
    sampling, generators and state, and the method's typed config."""

    def __init__(self, vllm_config: Any) -> None:
        settings = vllm_config.additional_config[ADDITIONAL_CONFIG_KEY]
        self.method: str = settings["method"]
        self.config = parse_config(self.method, settings["config"])
        self.sampling: dict[str, SamplingParams] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.requests: dict[str, Any] = {}  # the method's own per-request state, where it keeps one
        runner_hooks.install()
        cpu_kernels.install()

    def load_model(self, target_model: torch.nn.Module) -> None:
        """vLLM hands the target model over; drafts run it through the runner, which holds it too."""

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        raise RuntimeError("parallel-decoding proposers run through vllm_plugin.runner_hooks, which is not installed")

    def request(self, runner: Any, req_id: str) -> tuple[SamplingParams, torch.Generator]:
        """The request's sampling parameters and a CPU generator for our own draws.

        A seeded request gets a generator seeded apart from vLLM's own: drafts drawn from the stream vLLM's
        rejection sampler draws its uniforms from would be correlated with them, and sampling no longer exact.
        """
        if req_id not in self.sampling:
            params = request_sampling(runner.requests[req_id].sampling_params)
            self.sampling[req_id] = params
            generator = torch.Generator()
            if params.seed is None:
                generator.seed()
            else:
                generator.manual_seed(params.seed * DRAFT_SEED_STRIDE % 2**63 + 1)
            self.generators[req_id] = generator
        return self.sampling[req_id], self.generators[req_id]

    @property
    def entries(self) -> dict[str, int]:
        """How many requests each per-request table holds (all zero once vLLM has announced every finish)."""
        tables = {"sampling": self.sampling, "generators": self.generators, "requests": self.requests}
        return {name: len(table) for name, table in tables.items()}

    def forget(self, finished_req_ids: set[str]) -> None:
        """Drop the state of requests vLLM has finished or aborted."""
        for req_id in finished_req_ids:
            self.sampling.pop(req_id, None)
            self.generators.pop(req_id, None)
            self.requests.pop(req_id, None)
