"""vLLM with `diffusion_self` and `jacobi` returns exactly vLLM's own greedy output, and reports the acceptance
`common/`'s reference runner records for the same prompts."""

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.vllm_plugin.metrics import acceptance, planner
from tests.support import ties
from tests.support.vllm_cases import MAX_TOKENS, STOP_AT, reference_stats, untied

# A fixed cost model under which the width planner's choices follow each request's acceptance: widths vary per
# request and per step, and every run drafts (the measured costs of these tiny models on a CPU say plain AR).
PRICED = [1.0, 0.005, 0.1]
METHODS = [
    {"method": "diffusion_self", "num_speculative_tokens": 1, "step_cost": PRICED},
    {"method": "diffusion_self", "num_speculative_tokens": 4, "step_cost": PRICED},
    {"method": "diffusion_self", "num_speculative_tokens": 15, "step_cost": PRICED},
    # Rows priced for quadratic's (w + 1)(w + 3): requests held at no draft step on vLLM's own sampler (their
    # decoders paused) beside requests that draft.
    {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3, "step_cost": [1.0, 0.0005, 0.1]},
    # Rows priced lower: its plans count the steps that lay mask slots afresh after a rejection (verifying none), so at
    # PRICED its batch drafts only in its last few steps, too late for a draft to be verified.
    {"method": "wedlm_spec", "window": 4, "step_cost": [1.0, 0.002, 0.1]},
    {"method": "jacobi", "block_size": 4, "step_cost": PRICED},
    {"method": "jacobi", "block_size": 3, "num_blocks": 2, "spawn_ratio": 0.5, "step_cost": PRICED},
]


@pytest.fixture(scope="module")
def requests(engine_dir, prompts):
    """Per prompt: plain, stopped by a token from inside the output (as EOS would), and stopped by a string.

    Returned with vLLM's own outputs without speculation for each (the oracle).
    """
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(engine_dir["qwen3"]) as llm:
        first = llm.generate(prompts, greedy)
        params = []
        for out in first:
            tokens = out.outputs[0].token_ids
            params.append(greedy)
            params.append(SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[tokens[STOP_AT]]))
            params.append(SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop=[out.outputs[0].text[-12:-8]]))
        batch = [p for p in prompts for _ in range(3)]
        expected = llm.generate(batch, params)
    return batch, params, expected


@pytest.mark.parametrize("spec", METHODS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_greedy_equals_no_speculation(engine_dir, requests, spec):
    batch, params, expected = requests
    with engine(engine_dir["qwen3"], spec) as llm:
        got = llm.generate(batch, params)
        stats = acceptance(llm)
    cuts = ties.compare_greedy(engine_dir["qwen3"], [list(w.prompt_token_ids) for w in expected],
                               [list(o.outputs[0].token_ids) for o in got],
                               [list(w.outputs[0].token_ids) for w in expected])
    stopped = 0
    for want, out, cut in zip(expected, got, cuts, strict=True):
        if cut is None:
            assert out.outputs[0].text == want.outputs[0].text
            assert out.outputs[0].finish_reason == want.outputs[0].finish_reason
        stopped += want.outputs[0].finish_reason == "stop"
    assert stopped >= len(batch) // 3
    assert stats.num_drafts > 0


@pytest.mark.parametrize("spec", [METHODS[1], METHODS[5]], ids=["diffusion_self", "jacobi"])
def test_metrics_match_reference(engine_dir, prompts, spec):
    """On the prompts whose decoding takes no near-tied decision (drafts included), vLLM's counters are the
    reference runner's (at the configured width: `adaptive` off)."""
    spec = {**{k: v for k, v in spec.items() if k != "step_cost"}, "adaptive": False}
    settings = {k: v for k, v in spec.items() if k != "method"}
    prompts = untied(engine_dir["qwen3"], spec["method"], settings, prompts)
    assert len(prompts) >= 24
    with engine(engine_dir["qwen3"], spec) as llm:
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        got = acceptance(llm)
    want = reference_stats(engine_dir["qwen3"], spec["method"], settings, prompts)
    assert got == want
    assert got.num_accepted_tokens > 0


@pytest.mark.parametrize("spec", [METHODS[1], METHODS[5]], ids=["diffusion_self", "jacobi"])
def test_the_width_planner_decides_what_is_forwarded(engine_dir, requests, spec, monkeypatch):
    """With rows dear (`step_cost`: a row costs a hundred times a step's base) no request drafts: every step is a
    plain AR step, prepared as vLLM prepares one without speculation (no speculative metadata over zero drafts), and
    a batch like the last one takes the steady path (`WidthPlanner.plain_again`, no per-request planning); with rows
    free every request drafts the full width, as `adaptive: false` does. AR's output either way."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from parallel_decoding.common.width_planner import WidthPlanner

    batch, params, expected = requests
    metadata = GPUModelRunner._calc_spec_decode_metadata
    built = []
    monkeypatch.setattr(GPUModelRunner, "_calc_spec_decode_metadata",
                        lambda self, *args, **kwargs: built.append(1) or metadata(self, *args, **kwargs))
    plain_again, steady = WidthPlanner.plain_again, []
    monkeypatch.setattr(WidthPlanner, "plain_again",
                        lambda self, *args: steady.append(plain_again(self, *args)) or steady[-1])

    def drafted(extra: dict) -> tuple[list, int]:
        """Outputs and draft tokens of an engine that is gone when this returns (one engine at a time)."""
        with engine(engine_dir["qwen3"], {**spec, **extra}) as llm:
            return llm.generate(batch, params), acceptance(llm).num_draft_tokens

    dear, none = drafted({"step_cost": [0.01, 1.0, 1.0]})
    assert none == 0 and not built
    assert sum(steady) >= MAX_TOKENS // 4  # not every step: the batch changes as its requests end
    assert [o.outputs[0].token_ids for o in dear] == [w.outputs[0].token_ids for w in expected]
    assert drafted({"step_cost": [1.0, 0.0, 0.0]})[1] == drafted({"adaptive": False})[1] > 0
    assert built


PROBE = "parallel_decoding.vllm_plugin.probe.StateProbe"  # the worker extension the planner is read through


@pytest.mark.parametrize("spec", [METHODS[5]], ids=["jacobi"])
def test_each_step_carries_its_drafts_to_the_scheduler(engine_dir, requests, spec):
    """The engine core takes the next step's drafts from the step's output (`scheduler.CarryingScheduler`), never
    from a call to the worker of their own after the step, and tells the planner whether requests wait; AR's output,
    drafting."""
    batch, params, expected = requests
    with engine(engine_dir["qwen3"], spec, worker_extension_cls=PROBE) as llm:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        asked = []
        take = executor.take_draft_token_ids
        executor.take_draft_token_ids = lambda: asked.append(1) or take()
        got = llm.generate(batch, params)
        drafted = acceptance(llm).num_draft_tokens
        chose = planner(llm)
    assert drafted > 0 and not asked
    # The scheduler also tells the worker's planner whether requests wait (`WAITING`): none after the batch.
    assert chose["others_wait"] == 0, chose
    assert [o.outputs[0].token_ids for o in got] == [w.outputs[0].token_ids for w in expected]


def test_off_by_one_acceptance_fails_the_comparison(engine_dir, requests, monkeypatch):
    """The tie-aware comparison still catches a broken acceptance rule: vLLM's rejection sampler made to accept
    the draft at the first mismatch (one draft too many) gives outputs `ties.compare_greedy` rejects."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    forward = RejectionSampler.forward

    def one_too_many(self, metadata, draft_probs, logits, sampling_metadata):
        out = forward(self, metadata, draft_probs, logits, sampling_metadata)
        ids = out.sampled_token_ids
        for row, drafts in enumerate(metadata.draft_token_ids.split(metadata.num_draft_tokens)):
            kept = int((ids[row] >= 0).sum())
            if kept - 1 < drafts.numel():
                ids[row, kept - 1] = drafts[kept - 1]
        return out

    monkeypatch.setattr(RejectionSampler, "forward", one_too_many)
    batch, params, expected = requests
    with engine(engine_dir["qwen3"], METHODS[1]) as llm:
        got = llm.generate(batch, params)
    with pytest.raises(AssertionError, match="before any tie"):
        ties.compare_greedy(engine_dir["qwen3"], [list(w.prompt_token_ids) for w in expected],
                            [list(o.outputs[0].token_ids) for o in got],
                            [list(w.outputs[0].token_ids) for w in expected])


ADJUSTED = {"jacobi": ("jacobi_forcing", {"method": "jacobi", "block_size": 8, "adaptive": False}),
            "diffusion_self": ("nld", {"method": "diffusion_self", "num_speculative_tokens": 7, "adaptive": False})}


@pytest.mark.parametrize("method", [pytest.param("jacobi"), pytest.param("diffusion_self", marks=pytest.mark.sweep)])
def test_logit_bias_and_min_p_equal_ar(prompts, method):
    """`logit_bias` and `min_p`, which vLLM applies without speculation and refuses with it, the lossless methods
    apply to the target's logits before vLLM's rejection sampler (`PluginProposer.adjust_targets`): greedy under a
    bias that bans tokens of AR's output gives AR's tokens under it, and sampling at temperature 1 under min_p 1
    (only the most likely token left) gives greedy AR's; dropped, both differ. `logprobs` with them is refused."""

    from scripts.trained_models import SHIPPED

    checkpoint, spec = ADJUSTED[method]
    model, batch = SHIPPED / checkpoint, prompts[:4]
    plain, want, bias = ar_under_a_ban(model, batch)
    assert want != plain
    biased = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logit_bias=bias)
    only_the_likeliest = SamplingParams(temperature=1.0, seed=7, max_tokens=MAX_TOKENS, min_p=1.0)
    got, stats = generated_with_stats(model, spec, batch * 2, [biased] * len(batch) + [only_the_likeliest] * len(batch),
                                      refused=SamplingParams(max_tokens=4, logit_bias=bias, logprobs=1))
    assert got == want + plain
    assert stats.num_drafts > 0


def ar_under_a_ban(model, batch: list[str]) -> tuple[list, list, dict]:
    """vLLM's greedy tokens without speculation, a bias that bans one token of each output, and the tokens under it."""
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with engine(model) as llm:
        plain = [list(o.outputs[0].token_ids) for o in llm.generate(batch, greedy)]
        bias = {tokens[k]: -100.0 for tokens, k in zip(plain, (3, 5, 2, 4), strict=True)}
        biased = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logit_bias=bias)
        return plain, [list(o.outputs[0].token_ids) for o in llm.generate(batch, biased)], bias


def generated_with_stats(model, spec: dict, batch: list[str], params: list, refused) -> tuple[list, object]:
    """Tokens and acceptance under `spec`; `refused` must be refused naming logit_bias."""
    from vllm.exceptions import VLLMValidationError

    with engine(model, spec) as llm:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(batch, params)]
        stats = acceptance(llm)
        with pytest.raises(VLLMValidationError, match="logit_bias"):
            llm.generate(batch[:1], refused)
    return got, stats
