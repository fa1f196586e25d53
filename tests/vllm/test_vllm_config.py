"""Bad `--speculative-config` values are refused naming the field, before the model loads; the plugin changes
nothing for engines that do not select one of its methods."""

import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.support.vllm_engine import engine  # isort: split

import vllm.envs
from vllm import SamplingParams

from parallel_decoding.common.errors import ConfigError
from parallel_decoding.vllm_plugin import config as plugin_config
from parallel_decoding.vllm_plugin.config import check_vllm_version, translate, v2_runner_selected

BAD = [
    ({"method": "diffusion_self", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "diffusion_self", "num_speculative_tokens": 200}, "num_speculative_tokens"),
    ({"method": "diffusion_self", "draft_adapter": "linear_spec_lora"}, "draft_adapter"),
    ({"method": "jacobi", "block_size": 0}, "block_size"),
    ({"method": "jacobi", "spawn_ratio": 2}, "spawn_ratio"),
    ({"method": "jacobi", "pool_size": 4}, "recycling"),
    ({"method": "jacobi", "pool_size": 4, "recycling": "tree"}, "recycling"),
    ({"method": "jacobi", "denoise_steps": 4}, "denoise_steps"),
    ({"method": "wedlm", "window": 65}, "window"),
    ({"method": "wedlm", "window": 0}, "window"),
    ({"method": "wedlm", "entropy_threshold": -0.5}, "entropy_threshold"),
    ({"method": "wedlm", "distance_penalty": -1}, "distance_penalty"),
    ({"method": "diffusion", "block_size": 130}, "block_size"),
    ({"method": "diffusion", "confidence_threshold": 1.5}, "confidence_threshold"),
    ({"method": "huginn", "sampler": "speculative"}, "sampler"),
    ({"method": "huginn", "cache_lookup_strategy": "full"}, "cache_lookup_strategy"),
    ({"method": "huginn", "sampler": "ar", "exit_t": 0.1}, "exit_t"),
]


@pytest.mark.parametrize(("spec", "field"), BAD, ids=[f"{s['method']}-{f}" for s, f in BAD])
def test_offline_refused_naming_field(engine_dir, spec, field):
    with pytest.raises(ConfigError, match=field), engine(engine_dir["qwen3"], spec):
        pass


@pytest.fixture(scope="module")
def maskless(engine_dir, tmp_path_factory):
    """The tiny Qwen3 with no mask token in its config or its tokenizer."""
    path = tmp_path_factory.mktemp("maskless") / "qwen3"
    shutil.copytree(engine_dir["qwen3"], path)
    for name, key in (("config.json", "mask_token_id"), ("tokenizer_config.json", "mask_token")):
        data = json.loads((path / name).read_text())
        data.pop(key, None)
        (path / name).write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("method", ["diffusion_self", "wedlm", "diffusion"])
def test_model_without_mask_token_refused(maskless, method):
    with pytest.raises(ConfigError, match="mask_token_id"), engine(maskless, {"method": method}):
        pass
    with engine(maskless, {"method": method, "mask_token_id": 1}) as llm:
        assert llm.generate(["import os"], SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].token_ids


def refused_at_cli(model, spec: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--speculative-config", json.dumps(spec), "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "CI": "true"})


def test_cli_refuses_bad_value_without_traceback(engine_dir):
    done = refused_at_cli(engine_dir["qwen3"], {"method": "jacobi", "block_size": 0})
    assert done.returncode == 2
    assert "block_size must be a positive integer, got 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_refuses_model_without_mask_token_without_traceback(maskless):
    done = refused_at_cli(maskless, {"method": "diffusion_self"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: mask_token_id is required")
    assert "Traceback" not in done.stderr


def test_not_selected_changes_nothing(engine_dir):
    """A plain engine and an ngram engine run with no runner hook and no scheduler swap (fresh process)."""
    code = f"""
import os
import re
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.triton_utils.dispatcher import _registry
for spec in (None, {{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}}):
    llm = LLM(model={str(engine_dir["qwen3"])!r}, speculative_config=spec, enforce_eager=True,
              kv_cache_memory_bytes=64 << 20, max_model_len=512, dtype="float32")
    llm.generate(["import os"], SamplingParams(temperature=0, max_tokens=8))
    assert llm.llm_engine.vllm_config.scheduler_config.scheduler_cls is None
    assert "parallel_decoding" not in llm.llm_engine.vllm_config.additional_config
    del llm
assert not hasattr(GPUModelRunner.propose_draft_token_ids, "__wrapped__")
assert not hasattr(GPUModelRunner._sample, "__wrapped__")
from vllm.v1.engine.core import EngineCore
assert not hasattr(EngineCore.post_step, "__wrapped__")
from vllm.parser.parser_manager import ParserManager
assert not hasattr(ParserManager.get_parser, "parallel_decoding")
assert "vllm_plugin" not in _registry["vllm.v1.sample.rejection_sampler.expand_kernel"][1].__module__
print("UNCHANGED")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "UNCHANGED" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.1"])
def test_supported_vllm_versions(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0"])
def test_unsupported_vllm_refused(version):
    with pytest.raises(ConfigError, match=rf"supports vLLM >= 0\.32, < 0\.34; found {re.escape(version)}"):
        check_vllm_version(version)


def jacobi_args(**fields) -> SimpleNamespace:
    """Engine args naming method jacobi, as `translate` sees them, with nothing that selects a model runner."""
    base = {"watermark_config": None, "attention_config": None, "kv_transfer_config": None}
    return SimpleNamespace(speculative_config={"method": "jacobi"}, **{**base, **fields})


@pytest.fixture
def v2_env(monkeypatch):
    """Set VLLM_USE_V2_MODEL_RUNNER for one test; vllm.envs reads it afresh (an engine caches the environment)."""
    vllm.envs.disable_envs_cache()

    def set_value(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
        else:
            monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)

    return set_value


@pytest.mark.parametrize("value", ["1", "true", "TRUE"])
def test_v2_model_runner_refused_before_the_checkpoint(v2_env, value):
    """The refusal comes before anything reads the model (`model_config=None` would fail past it)."""
    v2_env(value)
    args = jacobi_args()
    pattern = r"method jacobi: parallel-decoding hooks vLLM's V1 model runner .*unset VLLM_USE_V2_MODEL_RUNNER"
    with pytest.raises(ConfigError, match=pattern):
        translate(args, None)
    assert args.speculative_config == {"method": "jacobi"}


def test_v2_model_runner_refused_at_cli_without_traceback(v2_env, monkeypatch):
    v2_env("1")
    monkeypatch.setitem(plugin_config._cli, "named_ours", True)
    with pytest.raises(SystemExit, match=r"^error: method jacobi: .*unset VLLM_USE_V2_MODEL_RUNNER"):
        translate(jacobi_args(), None)


def test_settings_that_force_v2_refused(v2_env):
    from vllm.config import KVTransferConfig

    v2_env(None)
    hisparse_connector = KVTransferConfig(kv_connector="HiSparseConnector", kv_role="kv_both",
                                          kv_connector_extra_config={"host_pool_gib": 1})
    assert "drop --watermark-config" in v2_runner_selected(jacobi_args(watermark_config={"type": "gumbel"}))
    assert "hisparse_config" in v2_runner_selected(jacobi_args(kv_transfer_config=hisparse_connector))
    assert "hisparse_config" in v2_runner_selected(jacobi_args(attention_config=SimpleNamespace(hisparse_config={})))


@pytest.mark.parametrize("value", [None, "0", "false"])
def test_v1_model_runner_passes(v2_env, value):
    v2_env(value)
    assert v2_runner_selected(jacobi_args()) is None


def test_huginn_tensor_parallel_refused_before_the_checkpoint(v2_env):
    v2_env(None)
    args = SimpleNamespace(speculative_config={"method": "huginn"}, watermark_config=None, attention_config=None,
                           kv_transfer_config=None, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match=r"huginn runs with tensor_parallel_size 1 only.*got 2"):
        translate(args, None)


@pytest.mark.parametrize("method", [{"method": "wedlm"}, {"method": "diffusion_self", "mode": "quadratic",
                                     "num_speculative_tokens": 3}, {"method": "huginn"}])
def test_processed_logprobs_mode_refused_for_committing_methods(v2_env, method):
    """Their decoders, not vLLM's sampler, process the logits: the raw modes are reported, the processed refused."""
    v2_env(None)
    args = jacobi_args(tensor_parallel_size=1, logprobs_mode="processed_logprobs")
    args.speculative_config = method
    with pytest.raises(ConfigError, match=r"reports logprobs_mode raw_logprobs or raw_logits.*'processed_logprobs'"):
        translate(args, None)


def test_every_method_common_serves_on_vllm_has_a_proposer():
    """The adapter's glue covers exactly the methods `common.methods` says vLLM serves."""
    from parallel_decoding.common.methods import served_by

    assert set(plugin_config.METHODS) == set(served_by("vllm"))
