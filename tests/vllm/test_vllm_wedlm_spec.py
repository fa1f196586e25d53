"""vLLM with `wedlm_spec`: on the shipped trained WeDLM checkpoint greedy outputs are greedy AR's, batched, and vLLM
accepts the drafts `common/`'s reference accepts; under sampling it follows the model's distribution exactly."""

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load
from parallel_decoding.vllm_plugin.metrics import acceptance
from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties
from tests.support.exact import P_VALUE_FLOOR, PARAMS, SAMPLES, SPEC_LENGTH, chi_square_p_value, exact_joint
from tests.support.vllm_cases import sampled

MAX_TOKENS = 48
SPEC = {"method": "wedlm_spec", "window": 8}


def test_trained_wedlm_greedy_equals_ar_and_accepts_as_the_reference():
    """On the held-out prompts whose reference decoding takes no near-tied decision."""
    model_dir = SHIPPED / "wedlm"
    tokenizer = load(model_dir)[1]
    prompts, reference, want = ties.untied_references(model_dir, "wedlm_spec", {"window": SPEC["window"]},
                                                      corpus.prompts(16), MAX_TOKENS)
    assert len(prompts) >= 8
    with engine(model_dir, SPEC) as llm:
        got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
        stats = acceptance(llm)
    ties.compare_greedy(model_dir, [tokenizer.encode(p) for p in prompts],
                        [list(o.outputs[0].token_ids) for o in got], want)
    assert stats.num_accepted_tokens == sum(d.acceptance.num_accepted_tokens for d in reference)
    assert stats.num_accepted_tokens / stats.num_drafts > 0.15, stats  # WeDLM-trained mask slots draft


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
