"""`common.methods`, the one description of each method: its width rules computed by hand, the architecture rule,
and a toy method that needs one entry there to parse, decode and be offered by the reference CLI."""

import dataclasses
from pathlib import Path

import pytest

from parallel_decoding.common.decoder import AutoregressiveDecoder, Limits
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.generate import parse_args
from parallel_decoding.common.methods import (
    METHODS,
    ARConfig,
    Method,
    check_architecture,
    commits,
    make_decoder,
    max_drafts,
    max_proposals,
    parse_config,
    served_by,
    step_methods,
)
from parallel_decoding.common.sampling import SamplingParams


@pytest.mark.parametrize(("method", "settings", "drafts", "proposals", "commit"), [
    ("jacobi", {"block_size": 4, "num_blocks": 2}, 8, 8, False),
    ("diffusion_self", {"num_speculative_tokens": 5}, 5, 5, False),
    ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3}, 4 * 6 - 1, 3, True),
    ("diffusion", {"block_size": 8}, 7, 7, True),
    ("wedlm", {"window": 6}, 12, 6, True),
    ("wedlm_spec", {"window": 6}, 11, 5, False),
    ("huginn", {"sampler": "wavefront", "max_wavefront": 8}, 7, 7, True),
    ("huginn", {"sampler": "adaptive"}, 1, 1, True),
])
def test_width_and_commit_rules(method, settings, drafts, proposals, commit):
    config = parse_config(method, settings)
    assert (max_drafts(method, config), max_proposals(method, config), commits(method, config)) == (
        drafts, proposals, commit)


def test_engines_serve_the_same_methods():
    assert served_by("vllm") == served_by("sglang") == [
        "jacobi", "diffusion_self", "diffusion", "wedlm", "wedlm_spec", "huginn"]
    assert "huginn" not in step_methods() and "assd" not in step_methods()


def test_a_checkpoint_is_served_by_the_method_built_for_it():
    check_architecture("huginn", ["RavenForCausalLM"])
    check_architecture("jacobi", ["LlamaForCausalLM"])
    with pytest.raises(ConfigError, match="method huginn serves RavenForCausalLM checkpoints"):
        check_architecture("huginn", ["LlamaForCausalLM"])
    with pytest.raises(ConfigError, match="served by method huginn only; got method 'wedlm'"):
        check_architecture("wedlm", ["RavenForCausalLM"])


def test_a_toy_method_is_one_entry(monkeypatch):
    monkeypatch.setitem(METHODS, "toy", Method("toy", ARConfig, decoder=AutoregressiveDecoder,
                                               drafts=lambda config: 3, proposals=lambda config: 2))
    config = parse_config("toy", "{}")
    assert (max_drafts("toy", config), max_proposals("toy", config), commits("toy", config)) == (3, 2, False)
    assert isinstance(make_decoder("toy", config, [1, 2], SamplingParams(), Limits(4)), AutoregressiveDecoder)
    assert "toy" in step_methods() and "toy" not in served_by("vllm")
    assert parse_args(["--model", "m", "--method", "toy", "--prompts-file", "p", "--json", "o"]).method == "toy"
    with pytest.raises(ConfigError, match="toy config has unknown field"):
        parse_config("toy", {"width": 2})


def test_every_setting_is_documented():
    """Each field of each method's config is in its settings table (docs/settings.md; Huginn's and ASSD's pages)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = {"huginn": "huginn.md", "assd": "assd.md"}
    missing = []
    for name, method in METHODS.items():
        text = (docs / pages.get(name, "settings.md")).read_text(encoding="utf-8")
        missing += [f"{name}.{f.name}" for f in dataclasses.fields(method.config) if f"`{f.name}`" not in text]
    assert missing == []
