"""vLLM test cases shared by several test files: lengths, the reference's statistics, untied prompts, the width
planner's pinned, dear and free runs."""

from pathlib import Path

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams, TokensPrompt

from parallel_decoding.common.acceptance import AcceptanceStats
from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from parallel_decoding.common.width_planner import WidthPlanner
from parallel_decoding.vllm_plugin.metrics import acceptance
from tests.support import ties
from tests.support.exact import LENGTH, PROMPT

MAX_TOKENS = 29
STOP_AT = 9


def untied(model_dir, method: str, settings: dict, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[str]:
    """The prompts on which the reference runner's decoding with `method` takes no decision near a tie."""
    model, tokenizer = load(model_dir)
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    kept = []
    for prompt in prompts:
        decoder = make_decoder(method, config, tokenizer.encode(prompt), ReferenceSampling(), Limits(max_tokens))
        if ties.tie_position(ReferenceRunner(model).run(decoder).margins) is None:
            kept.append(prompt)
    return kept


def reference_stats(model_dir, method: str, settings: dict, prompts: list[str], max_tokens: int = MAX_TOKENS
                    ) -> AcceptanceStats:
    """Acceptance counters of `common/`'s reference runner over `prompts`, summed as vLLM sums them."""
    model, tokenizer = load(model_dir)
    config = parse_config(method, settings, mask_token_id=model.config.mask_token_id)
    runs = []
    for prompt in prompts:
        decoder = make_decoder(method, config, tokenizer.encode(prompt), ReferenceSampling(), Limits(max_tokens))
        ReferenceRunner(model).run(decoder)
        runs.append(decoder.acceptance)
    return summed(runs)


def summed(runs: list[AcceptanceStats]) -> AcceptanceStats:
    """Counters of several requests added as vLLM adds them."""
    total = AcceptanceStats()
    for stats in runs:
        total.num_drafts += stats.num_drafts
        total.num_draft_tokens += stats.num_draft_tokens
        total.accepted_per_position += [0] * (len(stats.accepted_per_position) - len(total.accepted_per_position))
        for position, accepted in enumerate(stats.accepted_per_position):
            total.accepted_per_position[position] += accepted
    return total


def announce(llm) -> None:
    """The engine step that tells the workers which requests finished (a server's engine loop runs it by itself;
    offline it runs with the next request)."""
    while llm.llm_engine.engine_core.engine_core.scheduler.has_finished_requests():
        llm.llm_engine.step()


def sampled(llm, params: ReferenceSampling, seeds: range, max_tokens: int = LENGTH) -> list[tuple[int, ...]]:
    requests = [
        SamplingParams(temperature=params.temperature, top_p=params.top_p, seed=seed, max_tokens=max_tokens,
                       detokenize=False)
        for seed in seeds
    ]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)] * len(requests), requests, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids) for o in outputs]



# The width planner pinned, with rows a hundred times a step's base cost, and with rows free.
PLANNED = {"fixed": {"adaptive": False}, "dear": {"step_cost": [0.01, 1.0, 1.0]},
           "free": {"step_cost": [1.0, 0.0, 0.0]}}


def planner_decides(model_dir: Path, spec: dict, prompts: list[str], params: SamplingParams, want: list
                    ) -> AcceptanceStats:
    """Runs `spec` pinned, with rows dear and with rows free (one engine at a time): greedy AR's tokens (`want`,
    tie-aware) every time, no draft at all with rows dear, most of those steps on the steady path (the batch held at
    no draft, every request paused: `WidthPlanner.plain_again` counts them), exactly the pinned drafts with rows
    free. The pinned run's counters."""
    ids = [load(model_dir)[1].encode(p) for p in prompts]
    stats, steady = {}, {}
    plain_again = WidthPlanner.plain_again
    for label, extra in PLANNED.items():
        counted: list[bool] = []
        WidthPlanner.plain_again = lambda self, *args, counted=counted: counted.append(plain_again(self, *args)) \
            or counted[-1]
        try:
            got, stats[label] = _run(model_dir, {**spec, **extra}, prompts, params)
        finally:
            WidthPlanner.plain_again = plain_again
        steady[label] = sum(counted)
        ties.compare_greedy(model_dir, ids, got, want)
    assert stats["dear"].num_draft_tokens == 0
    assert steady["dear"] >= params.max_tokens // 2 and steady["fixed"] == 0, steady
    assert stats["free"].num_draft_tokens == stats["fixed"].num_draft_tokens > 0
    return stats["fixed"]


def _run(model_dir: Path, spec: dict, prompts: list[str], params: SamplingParams
         ) -> tuple[list[list[int]], AcceptanceStats]:
    """Token ids and counters of an engine that is gone when this returns (a name still bound to an engine breaks
    the next one's start)."""
    with engine(model_dir, spec) as llm:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)], acceptance(llm)
