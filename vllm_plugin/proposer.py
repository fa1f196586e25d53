"""The base of our vLLM proposers: the method's typed config, per-request sampling, and the runner hooks."""

import logging
import time
from dataclasses import replace
from typing import Any

import torch

from parallel_decoding.common.methods import parse_config
from parallel_decoding.common.penalties import biased
from parallel_decoding.common.sampling import SamplingParams, min_p_cut
from parallel_decoding.common.width_planner import WidthPlanner, planner_for
from parallel_decoding.vllm_plugin import cpu_kernels, runner_hooks
from parallel_decoding.vllm_plugin.config import ADDITIONAL_CONFIG_KEY
from parallel_decoding.vllm_plugin.requests import CARRIED_KEY
from parallel_decoding.vllm_plugin.scheduler import WAITING

logger = logging.getLogger("vllm.parallel_decoding")  # under vLLM's own logger, so its handler prints it

GREEDY_EPS = 1e-5
DRAFT_SEED_STRIDE = 0x9E3779B97F4A7C15


def request_sampling(params: Any, adjustments: bool = False) -> SamplingParams:
    """A vLLM request's sampling parameters as `common/` reads them (vLLM's near-zero temperature is greedy);
    `adjustments`: with its penalties, allowed tokens, minimum length (over vLLM's stop tokens), and the
    `logit_bias` and `min_p` carried past vLLM's checks (`vllm_plugin.requests.carry_adjustments`), for a decoder
    that commits by its own rule (a lossless method's target is adjusted by vLLM's own sampler, but for the carried
    `logit_bias` and `min_p`, which `PluginProposer.adjust_targets` applies to it)."""
    temperature = params.temperature if params.temperature >= GREEDY_EPS else 0.0
    carried = (params.extra_args or {}).get(CARRIED_KEY, {})
    sampling = SamplingParams(temperature=temperature, top_p=params.top_p, top_k=max(params.top_k, 0),
                              seed=params.seed, min_p=carried.get("min_p", 0.0),
                              logit_bias=tuple((int(t), float(b)) for t, b in carried.get("logit_bias", ())))
    if not adjustments:
        return sampling
    return replace(sampling, presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                   repetition_penalty=params.repetition_penalty,
                   allowed_token_ids=tuple(params.allowed_token_ids or ()), min_tokens=params.min_tokens,
                   stop_token_ids=tuple(sorted(params.all_stop_token_ids)))


class PluginProposer(runner_hooks.Hooked):
    """A `custom_class` proposer driven through `runner_hooks` with the model runner in hand: its per-request
    sampling, generators and state, the method's typed config, and its width planner where the method adapts its
    widths by load (`widths`, timed from each step's start to the end of its drafting)."""

    planner: WidthPlanner | None = None
    step_started: float | None = None
    held: list[str] | None = None  # the batch's requests while it is held at no draft, every one paused (`steady`)

    def __init__(self, vllm_config: Any) -> None:
        settings = vllm_config.additional_config[ADDITIONAL_CONFIG_KEY]
        self.method: str = settings["method"]
        self.committing: bool = settings["committing"]
        self.config = parse_config(self.method, settings["config"])
        self.sampling: dict[str, SamplingParams] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.unadjusted: set[str] = set()  # requests whose target rows `adjust_targets` leaves as they are
        self.requests: dict[str, Any] = {}  # the method's own per-request state, where it keeps one
        self.workers: int = vllm_config.parallel_config.world_size  # each plans the batch for itself
        # Widths chosen per step where the config adapts; by a cost model every worker shares where there are several
        # (tensor or pipeline parallel: their forwards must agree).
        self.planner = planner_for(self.config, measured=self.workers == 1)
        runner_hooks.install()
        cpu_kernels.install()

    def begin_step(self, runner: Any, scheduler_output: Any) -> None:
        self.step_started = time.perf_counter()
        if self.planner is not None:
            self.planner.began(list(scheduler_output.num_scheduled_tokens))  # `StepGap`
            self.planner.others_wait = getattr(scheduler_output, WAITING, True)

    def widths(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]], limits: list[int],
               iterated: list[bool] | None = None) -> list[int]:
        """Drafts per batch row for the next step: the planner's, after it has seen how this step's verification
        went (drafts scheduled, accepted; not where the drafts were not `iterated`, `Decoder.iterated`), or `limits`
        without a planner (and for seeded requests while the cost is measured: `WidthPlanner.plan`)."""
        if self.planner is None:
            return limits
        req_ids = list(runner.input_batch.req_ids)
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        self.planner.record(req_ids, [len(scheduled.get(req_id, ())) for req_id in req_ids],
                            [max(len(sampled) - 1, 0) for sampled in sampled_token_ids], iterated)
        seeded = [runner.requests[req_id].sampling_params.seed is not None for req_id in req_ids]
        return self.planner.plan(req_ids, limits, seeded).tolist()

    def steady(self, req_ids: list[str]) -> bool:
        """Whether the batch is the one the last step held (`hold`): the same requests, every one paused before that
        step and held at no draft by it, none woken since (only a step that is not steady wakes one). Under load
        most steps are such, and the hooks pass them through with no per-request work."""
        return self.held is not None and self.held == req_ids

    def hold(self, req_ids: list[str], paused: bool) -> None:
        """After a step whose every request was `paused` before it and after it: its batch is held (`steady`), planned
        from each one's configured width, as the steady steps that follow would be."""
        if self.planner is not None and paused:
            self.held = list(req_ids)

    def steady_step(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]]) -> bool:
        """`draft`'s shortcut: a steady batch whose requests each committed their token, where the planner's plain
        plan stands (`WidthPlanner.plain_again`); the step's cost taken, no drafts. Otherwise the batch is no longer
        held, and `draft` goes the usual way."""
        if self.steady(runner.input_batch.req_ids) and self.planner is not None \
                and all(len(tokens) == 1 for tokens in sampled_token_ids) and self.planner.plain_again():
            self.step_done(scheduler_output)
            return True
        self.held = None
        return False

    def step_done(self, scheduler_output: Any, draft_rows: int = 0) -> None:
        """The step's cost for the planner: its scheduled rows and `draft_rows` in a draft forward of its own, a
        drafting step where it verified drafts or ran that forward. Steps that prefill are left out: the planner
        prices decode rows, and a prompt's rows cost otherwise."""
        started, self.step_started = self.step_started, None
        if self.planner is None or started is None:
            return
        spec = scheduler_output.scheduled_spec_decode_tokens
        if any(n != 1 + len(spec.get(req_id, ())) for req_id, n in scheduler_output.num_scheduled_tokens.items()):
            return  # a prefill step
        drafting = draft_rows > 0 or any(spec.values())
        report = self.planner.observe(scheduler_output.total_num_scheduled_tokens + draft_rows, int(drafting),
                                      time.perf_counter() - started, list(scheduler_output.num_scheduled_tokens))
        if report is not None:
            logger.info("parallel-decoding width planner (%s): %s", self.method, report)

    @staticmethod
    def catch_up(runner: Any, row: int, decoder: Any) -> None:
        """A paused decoder (`Decoder.pause`) takes the tokens vLLM committed for batch row `row` since it paused,
        read from the input batch's token ids (the prompt's and the outputs' alike)."""
        batch = runner.input_batch
        known = int(batch.num_tokens_no_spec[row])
        decoder.catch_up(batch.token_ids_cpu[row, decoder.num_tokens : known].tolist())
        assert decoder.finished or decoder.num_tokens == known, f"row {row}: its decoder lost vLLM's tokens"

    def load_model(self, target_model: torch.nn.Module) -> None:
        """vLLM hands the target model over; drafts run it through the runner, which holds it too."""

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        raise RuntimeError("parallel-decoding proposers run through vllm_plugin.runner_hooks, which is not installed")

    def adjust_targets(self, runner: Any, logits: torch.Tensor, metadata: Any) -> None:
        """A lossless method's target rows with each request's carried `logit_bias` added and, where it samples,
        `min_p`'s cut made as vLLM's sampler makes them, in place, before vLLM's rejection sampler and our drafts read
        them: vLLM applies neither under speculation (`requests.carry_adjustments` carries them past its check)."""
        req_ids = runner.input_batch.req_ids
        if self.committing or self.unadjusted.issuperset(req_ids):
            return  # a committing decoder adjusts its own rows; none of the batch's requests asks for either
        ends = metadata.cu_num_sampled_tokens.tolist() if metadata is not None else range(1, len(req_ids) + 1)
        start = 0
        for req_id, end in zip(req_ids, ends, strict=True):
            sampling, _ = self.request(runner, req_id)
            if sampling.logit_bias:
                biased(logits[start:end], sampling)
            if sampling.min_p and not sampling.greedy:
                min_p_cut(logits[start:end], sampling.min_p, sampling.temperature)
            start = end

    def request(self, runner: Any, req_id: str) -> tuple[SamplingParams, torch.Generator]:
        """The request's sampling parameters and a CPU generator for our own draws.

        A seeded request gets a generator seeded apart from vLLM's own: drafts drawn from the stream vLLM's
        rejection sampler draws its uniforms from would be correlated with them, and sampling no longer exact.
        """
        if req_id not in self.sampling:
            params = request_sampling(runner.requests[req_id].sampling_params)
            self.sampling[req_id] = params
            if not params.logit_bias and (not params.min_p or params.greedy):
                self.unadjusted.add(req_id)
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
        tables = {"sampling": self.sampling, "generators": self.generators, "requests": self.requests,
                  "unadjusted": self.unadjusted}
        return {name: len(table) for name, table in tables.items()}

    def forget(self, finished_req_ids: set[str]) -> None:
        """Drop the state of requests vLLM has finished or aborted."""
        if self.planner is not None:
            self.planner.forget(finished_req_ids)
        for req_id in finished_req_ids:
            self.sampling.pop(req_id, None)
            self.unadjusted.discard(req_id)
            self.generators.pop(req_id, None)
            self.requests.pop(req_id, None)
