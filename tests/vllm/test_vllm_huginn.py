"""Huginn on vLLM (`{"method": "huginn", "sampler": ...}` on a `RavenForCausalLM` checkpoint): every sampler the
engine serves gives the `common.huginn` reference's tokens and logprobs, greedy and seeded, batched; the wavefront
keeps its saving of sequential core passes on the trained Raven; preempted requests finish and leave nothing
behind; a method and a checkpoint that do not go together are refused."""

from pathlib import Path

import pytest
import torch

from tests.support.vllm_engine import engine  # isort: split

from transformers import AutoTokenizer
from vllm import SamplingParams, TokensPrompt

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.huginn.config import HuginnConfig
from parallel_decoding.common.huginn.decoder import HuginnDecoder
from parallel_decoding.common.huginn.forward import RecurrentForward, run_forward
from parallel_decoding.common.huginn.reference import generate
from parallel_decoding.common.models.raven import KVCache, RavenForCausalLM
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from tests.support import huginn_grammar
from tests.support.vllm_cases import announce

MAX_TOKENS = 24
SEED = 11
TRAINED = Path(__file__).resolve().parents[2] / "scripts" / "trained" / "raven"


def token_prompts(model_dir: Path, texts: list[str]) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text)[:12] for text in texts]


# What every other request adjusts under `adjusted` (the ones that ask for no logprobs): the penalties, a bias and
# min-p, which Huginn's samplers apply to each position with the tokens before it as its history.
ADJUSTED = {"repetition_penalty": 2.0, "frequency_penalty": 0.5, "min_p": 0.1, "logit_bias": {7: -3.0}}


def reference(model_dir: Path, prompts: list[list[int]], settings: dict, temperatures: tuple[float, ...],
              adjusted: bool = False) -> list:
    model = RavenForCausalLM.from_pretrained(model_dir)
    config = HuginnConfig(**settings)
    adjust = {**ADJUSTED, "logit_bias": tuple(ADJUSTED["logit_bias"].items())}
    return [generate(model, p, config, ReferenceSampling(temperature=t, seed=SEED + i,
                                                         **(adjust if adjusted and i % 2 else {})), Limits(MAX_TOKENS))
            for t in temperatures for i, p in enumerate(prompts)]


def served(model_dir: Path, prompts: list[list[int]], settings: dict, temperatures: tuple[float, ...],
           adjusted: bool = False, **kwargs) -> tuple[list, int, dict[str, int]]:
    """Every prompt at every temperature in one batch, every other request asking for logprobs (the others
    `ADJUSTED` where `adjusted`): its outputs, the core passes the engine ran, and the proposer's per-request tables
    after the batch."""
    params = [SamplingParams(temperature=t, seed=SEED + i, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False,
                             logprobs=2 if i % 2 == 0 else None, prompt_logprobs=1 if i == 0 else None,
                             **(ADJUSTED if adjusted and i % 2 else {}))
              for t in temperatures for i in range(len(prompts))]
    with engine(model_dir, {"method": "huginn", **settings}, skip_tokenizer_init=True, **kwargs) as llm:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        before = runner.get_model().core_passes
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for _ in temperatures for p in prompts], params,
                               use_tqdm=False)
        announce(llm)
        return outputs, runner.get_model().core_passes - before, runner.drafter.entries


# The random Raven's latents hardly converge: past `max_diffusion_steps` its wavefront freezes one position a step
# (without the bound, about 2,000 steps a request).
# The wavefront (windows of several positions) in CI; `ar` and `adaptive` (one position a step, through the same
# runner) as sweeps, as in SGLang's test.
@pytest.mark.parametrize("settings", [pytest.param({"sampler": "ar"}, id="ar", marks=pytest.mark.sweep),
                                      pytest.param({"sampler": "adaptive", "num_steps": 16}, id="adaptive",
                                                   marks=pytest.mark.sweep),
                                      pytest.param({"sampler": "wavefront", "num_steps": 16, "inner_recurrence": 4,
                                                    "max_diffusion_steps": 32}, id="wavefront")])
def test_samplers_equal_the_reference(engine_dir, prompts, settings):
    """Tokens, the logprobs of the rows that chose them, and the prompt's, greedy and sampled, with the penalties,
    a bias and min-p on every other request."""
    model_dir = engine_dir["raven"]
    ids = token_prompts(model_dir, prompts[:4])
    want = reference(model_dir, ids, settings, (0.0, 1.0), adjusted=True)
    outputs, _, entries = served(model_dir, ids, settings, (0.0, 1.0), adjusted=True)
    got = [o.outputs[0] for o in outputs]
    assert [list(o.token_ids) for o in got] == [r.token_ids for r in want]
    unadjusted = reference(model_dir, ids, settings, (0.0, 1.0))
    assert [r.token_ids for r in want[1::2]] != [r.token_ids for r in unadjusted[1::2]]  # the adjustments bite
    assert sum(entries.values()) == 0
    for i, (out, ref) in enumerate(zip(got, want, strict=True)):  # the rows that chose each token
        if i % len(ids) % 2:
            assert out.logprobs is None
        else:
            reported = [step[token].logprob for step, token in zip(out.logprobs, out.token_ids, strict=True)]
            assert torch.allclose(torch.tensor(reported), torch.tensor(ref.logprobs), atol=1e-4), i
    model, config = RavenForCausalLM.from_pretrained(model_dir), HuginnConfig(**settings)
    for request, (prompt, seed) in enumerate([(ids[0], SEED)] * 2):  # the prefill's rows, as `ar` runs them
        decoder = HuginnDecoder(prompt, ReferenceSampling(seed=seed), Limits(MAX_TOKENS), config, model)
        forward = RecurrentForward(torch.tensor(prompt), 0, decoder.latents(0, len(prompt)), config.num_steps)
        with torch.inference_mode():
            rows = run_forward(model, KVCache(config.cache_lookup_strategy), forward).logits.log_softmax(-1)
        reported = outputs[request * len(ids)].prompt_logprobs
        assert reported[0] is None and len(reported) == len(prompt)
        values = [step[token].logprob for step, token in zip(reported[1:], prompt[1:], strict=True)]
        want_values = rows[:-1].gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(values), want_values, atol=1e-4)


def test_trained_wavefront_saves_core_passes():
    """On the trained Raven at r = 32, the batch's sequential core passes under the wavefront are at most a quarter
    of `ar`'s (the reference saves about 6.8x), with the reference's tokens and logprobs."""
    ids = token_prompts(TRAINED, ["def __init__(self, name", "    return self._data[", "import os\nimport sys\n"])
    wavefront = {"sampler": "wavefront", "num_steps": 32, "inner_recurrence": 4}
    outputs, passes, _ = served(TRAINED, ids, wavefront, (0.0,))
    got, want = [o.outputs[0] for o in outputs], reference(TRAINED, ids, wavefront, (0.0,))
    assert [list(o.token_ids) for o in got] == [r.token_ids for r in want]
    for out, ref in zip(got[::2], want[::2], strict=True):  # several tokens frozen per step, each its own row's
        reported = [step[token].logprob for step, token in zip(out.logprobs, out.token_ids, strict=True)]
        assert torch.allclose(torch.tensor(reported), torch.tensor(ref.logprobs), atol=1e-4)
    _, ar_passes, _ = served(TRAINED, ids, {"sampler": "ar", "num_steps": 32}, (0.0,))
    assert ar_passes == 32 * MAX_TOKENS
    assert 4 * passes <= ar_passes, (passes, ar_passes)


def test_preempted_requests_finish_and_leave_nothing(engine_dir, prompts):
    """Under KV pressure: a preempted request's KV is recomputed as `ar` computes it (the wavefront's is not kept),
    so its tokens may differ from the roomy run's; it still gets all its tokens, and nothing stays behind."""
    model_dir = engine_dir["raven"]
    ids = [p * 4 for p in token_prompts(model_dir, prompts[:8])]
    settings = {"sampler": "wavefront", "num_steps": 8, "inner_recurrence": 2}
    with engine(model_dir, {"method": "huginn", **settings}, skip_tokenizer_init=True, max_num_seqs=8,
                max_model_len=256, num_gpu_blocks_override=12) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids],
                               SamplingParams(temperature=0, max_tokens=96, ignore_eos=True, detokenize=False),
                               use_tqdm=False)
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
        announce(llm)
        assert sum(drafter.entries.values()) == 0
    assert preemptions >= 1
    assert all(len(o.outputs[0].token_ids) == 96 for o in outputs)


@pytest.mark.parametrize(("family", "spec"), [("raven", {"method": "jacobi"}), ("qwen3", {"method": "huginn"})])
def test_method_and_checkpoint_must_match(engine_dir, family, spec):
    with pytest.raises(ConfigError, match="huginn"), engine(engine_dir[family], spec):
        pass


def test_unapplied_request_option_refused(engine_dir):
    from vllm.exceptions import VLLMValidationError

    with engine(engine_dir["raven"], {"method": "huginn", "sampler": "wavefront"}, skip_tokenizer_init=True) as llm, \
            pytest.raises(VLLMValidationError, match="logprob_token_ids"):
        llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4, logprob_token_ids=[1]))


def test_published_config_instantiates(tmp_path):
    """Huginn-0125's `config.json` (remote-code `auto_map` and all) builds the vLLM model class: shapes only."""
    import json

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    from parallel_decoding.vllm_plugin.raven import RavenForCausalLM as VllmRaven
    from tests.support.huginn_configs import HUGINN_0125

    (tmp_path / "config.json").write_text(json.dumps(HUGINN_0125))
    config = EngineArgs(model=str(tmp_path), skip_tokenizer_init=True, dtype="bfloat16").create_engine_config()
    with set_current_vllm_config(config), torch.device("meta"):
        model = VllmRaven(vllm_config=config)
    assert 3.4e9 < sum(p.numel() for p in model.parameters()) < 3.7e9
    assert len(model.attn) == 8 and model.attn[0].head_size == 96  # one KV slot per layer, the core's shared


def test_runs_eager(engine_dir):
    """Every forward reads the rows staged for it, so no graph may replay an old one: the plugin turns them off."""
    with engine(engine_dir["raven"], {"method": "huginn"}, enforce_eager=False, skip_tokenizer_init=True) as llm:
        assert llm.llm_engine.vllm_config.model_config.enforce_eager
        out = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("which", ["code", pytest.param("structured", marks=pytest.mark.sweep)])
def test_structured_output_equals_the_constrained_reference(which):
    """On the trained Raven, the wavefront under regexes and JSON schemas (vLLM's xgrammar backend compiling them
    for the decoder): the reference's tokens under the same constraints, every output valid. Four code requests in
    CI; the 40 requests of `scripts.structured_requests` as a sweep."""
    from vllm.sampling_params import StructuredOutputsParams

    work = huginn_grammar.cases(which)
    want = huginn_grammar.reference(work)
    with engine(TRAINED, {"method": "huginn", **huginn_grammar.SETTINGS}) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _, _ in work], [
            SamplingParams(temperature=0, max_tokens=n, structured_outputs=StructuredOutputsParams(**c))
            for _, c, n in work], use_tqdm=False)
        announce(llm)
    huginn_grammar.check(work, [list(o.outputs[0].token_ids) for o in outputs], want)
