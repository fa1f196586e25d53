"""vLLM with `wedlm_spec`: on the shipped trained WeDLM checkpoint greedy outputs are greedy AR's, batched, and vLLM
accepts the drafts `common/`'s reference accepts, its width planner deciding what is forwarded; under sampling it
follows the model's distribution exactly."""


from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.vllm_plugin.metrics import acceptance
from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.exact import P_VALUE_FLOOR, PARAMS, SAMPLES, SPEC_LENGTH, chi_square_p_value, exact_joint
from tests.support.vllm_cases import planner_decides, sampled

MAX_TOKENS = 48
SPEC = {"method": "wedlm_spec", "window": 8}


def test_trained_wedlm_greedy_equals_ar_and_accepts_as_the_reference():
    """On the held-out prompts whose reference decoding takes no near-tied decision: at the configured window
    (`adaptive: false`) vLLM accepts what the reference accepts. The width planner decides what is forwarded: with
    rows dear (`step_cost`) no draft or mask slot at all, with rows free the whole window, as pinned; greedy AR's
    tokens every time."""
    model_dir = SHIPPED / "wedlm"
    prompts, reference, want = ties.untied_references(model_dir, "wedlm_spec", {"window": SPEC["window"]},
                                                      corpus.prompts(16), MAX_TOKENS)
    assert len(prompts) >= 8
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    fixed = planner_decides(model_dir, SPEC, prompts, params, want)
    assert fixed.num_accepted_tokens == sum(d.acceptance.num_accepted_tokens for d in reference)
    assert fixed.num_accepted_tokens / fixed.num_drafts > 0.15, fixed  # WeDLM-trained mask slots draft


def test_sampled_distribution_matches_model(vocab8):
    path, model = vocab8
    params = PARAMS[0]
    with engine(path, {"method": "wedlm_spec", "window": 3}, skip_tokenizer_init=True) as llm:
        outputs = sampled(llm, params, range(SAMPLES), max_tokens=SPEC_LENGTH)
        stats = acceptance(llm)
    counts: dict[tuple[int, ...], int] = {}
    for key in outputs:
        counts[key] = counts.get(key, 0) + 1
    assert stats.num_accepted_tokens > 0
    assert chi_square_p_value(counts, exact_joint(model, params, SPEC_LENGTH)) > P_VALUE_FLOOR
