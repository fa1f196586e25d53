"""vLLM at `tensor_parallel_size=2` (the `mp` executor, one core per worker): quadratic self-speculation, whose
structured-mask passes run on every worker's shard of the heads, gives the `common/` reference's greedy tokens on
the trained NLD checkpoint. `python -m scripts.tp_check` runs every method at TP 1 and 2."""

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load
from scripts import corpus
from scripts.trained_models import SHIPPED
from tests.support import ties

SPEC = {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3}
MAX_TOKENS = 32


def test_quadratic_at_tp2_equals_reference(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    model_dir = SHIPPED / "nld"
    tokenizer = load(model_dir)[1]
    settings = {k: v for k, v in SPEC.items() if k != "method"}
    prompts, _, want = ties.untied_references(model_dir, "diffusion_self", settings, corpus.prompts(8), MAX_TOKENS)
    with engine(model_dir, SPEC, tensor_parallel_size=2, distributed_executor_backend="mp") as llm:
        got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    ties.compare_greedy(model_dir, [tokenizer.encode(p) for p in prompts],
                        [list(o.outputs[0].token_ids) for o in got], want)
