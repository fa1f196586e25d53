"""Checkpoints as shipped serve under vLLM without their remote code and decode exactly as the reference runner:
WeDLM (`WeDLMForCausalLM`, `auto_map`, `mask_token_id: null`) in both shapes, NLD (`NemotronLabsDiffusionModel`)."""

import json

import pytest

from tests.support.vllm_engine import engine  # isort: split

from vllm import SamplingParams

from parallel_decoding.common.checkpoint import load, resolve_mask_token_id
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.draft_layout import resolve_dlm_type
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams as ReferenceSampling
from scripts.make_tiny_models import as_wedlm
from tests.support import ties
from tests.support.vllm_cases import MAX_TOKENS

NLD_TOKENS = 40
SPEC = {"method": "wedlm", "window": 8, "entropy_threshold": 5.0, "distance_penalty": 0.02}


@pytest.fixture(scope="module", params=["qwen3", "qwen2"], ids=["wedlm-8b-shape", "wedlm-7b-shape"])
def wedlm_dir(request, engine_dir, tmp_path_factory):
    """The tiny Qwen3 (q/k norm) or Qwen2 (qkv bias, `attention_bias: true`) dressed as WeDLM ships."""
    path = as_wedlm(engine_dir[request.param], tmp_path_factory.mktemp("wedlm") / request.param)
    config = json.loads((path / "config.json").read_text())
    config["attention_bias"] = request.param == "qwen2"
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_wedlm_checkpoint_equals_reference(wedlm_dir, prompts):
    model, tokenizer = load(wedlm_dir)
    assert model.config.mask_token_id is None
    mask_id = resolve_mask_token_id(model.config, tokenizer)
    config = parse_config("wedlm", {k: v for k, v in SPEC.items() if k != "method"}, mask_token_id=mask_id)
    expected = [
        ReferenceRunner(model).run(
            make_decoder("wedlm", config, tokenizer.encode(p), ReferenceSampling(), Limits(MAX_TOKENS))
        )
        for p in prompts[:8]
    ]
    with engine(wedlm_dir, SPEC) as llm:
        architecture = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner.model).__name__
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[:8], SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))]
    ties.compare(got, [e.token_ids for e in expected], [e.margins for e in expected])
    shape = json.loads((wedlm_dir / "config.json").read_text())["attention_bias"]
    assert architecture == ("Qwen2ForCausalLM" if shape else "WeDLMForCausalLM")


NLD_SPECS = [
    None,
    {"method": "diffusion_self", "num_speculative_tokens": 6},
    {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.3},
]


@pytest.mark.parametrize("spec", NLD_SPECS, ids=["ar", "diffusion_self", "diffusion"])
def test_nld_checkpoint_equals_reference(engine_dir, prompts, spec):
    """NLD as shipped serves under vLLM (its Mistral model, YaRN and llama-4 query scaling past position 32) and
    decodes as the reference runner on the stock Ministral3 class: greedy AR for AR and the lossless
    `diffusion_self`, the same `diffusion` (with the checkpoint's `dlm_type`) for block diffusion."""
    nld = engine_dir["nld"]
    model, tokenizer = load(nld)
    method = spec["method"] if spec else "ar"
    settings = {k: v for k, v in (spec or {}).items() if k != "method"}
    reference_method = "ar" if method == "diffusion_self" else method  # lossless: equals greedy AR
    config = resolve_dlm_type(parse_config(reference_method, {} if reference_method == "ar" else settings,
                                           mask_token_id=model.config.mask_token_id), model.config)
    runner = ReferenceRunner(model)
    expected = [
        runner.run(make_decoder(reference_method, config, tokenizer.encode(p), ReferenceSampling(),
                                Limits(NLD_TOKENS)))
        for p in prompts
    ]
    with engine(nld, spec) as llm:
        architecture = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner.model).__name__
        got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, SamplingParams(
            temperature=0, max_tokens=NLD_TOKENS, ignore_eos=True))]
    assert architecture == "NemotronLabsDiffusionForCausalLM"
    ties.compare(got, [e.token_ids for e in expected], [e.margins for e in expected])
