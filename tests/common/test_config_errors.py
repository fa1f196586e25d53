"""Bad settings are refused before any forward, with a message naming the field and what is allowed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from parallel_decoding.common.checkpoint import resolve_mask_token_id
from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.draft_layout import resolve_dlm_type
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.sampling import SamplingParams

BAD = [
    ("wedlm", {"window": 0}, "window"),
    ("wedlm", {"window": -3}, "window"),
    ("wedlm", {"entropy_threshold": -0.1}, "entropy_threshold"),
    ("wedlm", {"distance_penalty": -1}, "distance_penalty"),
    ("wedlm_spec", {"window": 1}, "window"),
    ("diffusion", {"block_size": 1}, "block_size"),
    ("diffusion", {"confidence_threshold": 1.5}, "confidence_threshold"),
    ("diffusion", {"confidence_threshold": 0}, "confidence_threshold"),
    ("diffusion_self", {"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ("diffusion_self_quadratic", {"block_size": 1}, "block_size"),
    ("diffusion_self", {"mode": "cubic"}, "mode"),
    ("jacobi", {"block_size": 0}, "block_size"),
    ("jacobi", {"num_blocks": 0}, "num_blocks"),
    ("jacobi", {"spawn_ratio": 1.2}, "spawn_ratio"),
    ("jacobi", {"pool_size": -1}, "pool_size"),
    ("jacobi", {"recycling": "tree"}, "recycling"),
    ("jacobi", {"blocksize": 4}, "blocksize"),
    ("wedlm", {"mask_token_id": -5}, "mask_token_id"),
]


@pytest.mark.parametrize(("method", "settings", "field"), BAD)
def test_bad_config_names_field(method, settings, field):
    with pytest.raises(ConfigError, match=field):
        parse_config(method, settings)


def test_unknown_method_lists_allowed():
    with pytest.raises(ConfigError, match=r"method must be one of .*wedlm"):
        parse_config("medusa", {})


def test_malformed_json():
    with pytest.raises(ConfigError, match="JSON"):
        parse_config("jacobi", "{block_size: 4")


@pytest.mark.parametrize("method", ["wedlm", "diffusion", "diffusion_self"])
def test_mask_token_required(method):
    config = parse_config(method, {})
    with pytest.raises(ConfigError, match="mask_token_id"):
        make_decoder(method, config, [1, 2], SamplingParams(), Limits(4))


def test_sampling_and_limits_validated():
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        Limits(max_tokens=0)


def test_mask_token_resolution_order():
    config, tokenizer = SimpleNamespace(vocab_size=100, mask_token_id=5), SimpleNamespace(mask_token_id=7)
    assert resolve_mask_token_id(config, tokenizer, 9) == 9
    assert resolve_mask_token_id(config, tokenizer) == 5
    assert resolve_mask_token_id(SimpleNamespace(vocab_size=100, mask_token_id=None), tokenizer) == 7
    with pytest.raises(ConfigError, match="mask_token_id"):
        resolve_mask_token_id(SimpleNamespace(vocab_size=100), SimpleNamespace(mask_token_id=None))
    with pytest.raises(ConfigError, match=r"\[0, 100\)"):
        resolve_mask_token_id(config, tokenizer, 100)


def test_dlm_type_resolution_order():
    """The method config's dlm_type, else the checkpoint's, else NLD's default; unknown values named."""
    config = parse_config("diffusion", {}, mask_token_id=3)
    assert resolve_dlm_type(config, SimpleNamespace(dlm_type="dream")).dlm_type == "dream"
    assert resolve_dlm_type(config, SimpleNamespace()).dlm_type == "llada"
    explicit = parse_config("diffusion_self", {"dlm_type": "dream"})
    assert resolve_dlm_type(explicit, SimpleNamespace(dlm_type="llada")).dlm_type == "dream"
    jacobi = parse_config("jacobi", {})
    assert resolve_dlm_type(jacobi, SimpleNamespace(dlm_type="llada")) is jacobi
    with pytest.raises(ConfigError, match=r"dlm_type must be one of \['llada', 'dream'\], got 'mdm'"):
        parse_config("diffusion", {"dlm_type": "mdm"})
    with pytest.raises(ConfigError, match="model config's dlm_type"):
        resolve_dlm_type(config, SimpleNamespace(dlm_type="mdm"))


def test_cli_refuses_model_without_mask_token(tiny_dir, tmp_path):
    """A checkpoint whose config and tokenizer carry no mask token is refused for wedlm, naming the field."""
    model_dir = tmp_path / "no-mask"
    shutil.copytree(tiny_dir / "llama", model_dir)
    for name, key in (("config.json", "mask_token_id"), ("tokenizer_config.json", "mask_token")):
        data = json.loads((model_dir / name).read_text())
        data.pop(key, None)
        (model_dir / name).write_text(json.dumps(data))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("import os\n")
    cmd = [sys.executable, "-m", "parallel_decoding.common.generate", "--model", str(model_dir), "--method", "wedlm",
           "--prompts-file", str(prompts), "--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "mask_token_id" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("preset", sorted(Path(__file__).parents[2].glob("configs/*.json")), ids=lambda p: p.name)
def test_presets_parse(preset):
    method = {"wedlm": "wedlm", "wedlm-spec": "wedlm_spec", "nld-diffusion": "diffusion",
              "nld-self-spec": "diffusion_self", "jacobi-forcing": "jacobi",
              "nld-quadratic": "diffusion_self_quadratic", "smollm2-self-spec": "diffusion_self",
              "smollm2-quadratic": "diffusion_self"}[
        preset.stem.removeprefix("tiny-").removesuffix("-conservative").removesuffix("-aggressive")]
    settings = json.loads(preset.read_text())
    config = parse_config(method, str(preset))
    assert {name: getattr(config, name) for name in settings} == settings


def test_cli_refuses_empty_prompt_before_loading(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("import os\n\nimport sys\n")
    cmd = [sys.executable, "-m", "parallel_decoding.common.generate", "--model", str(tmp_path / "absent"),
           "--method", "ar",
           "--prompts-file", str(prompts), "--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "empty line(s): [2]" in proc.stderr and "Traceback" not in proc.stderr
