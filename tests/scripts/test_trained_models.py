"""The shipped trained checkpoints: the documented command copies them, and on held-out prompts (reference runner,
greedy) each method earns at least its recorded tokens per forward on the checkpoint trained for it, lossless ones
token for token equal to AR; Jacobi Forcing's training earns Jacobi decoding more than the base model gives it."""

import math
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

from common.checkpoint import load
from scripts import corpus
from scripts.evaluation import assd, huginn, quality
from scripts.train import OBJECTIVES
from scripts.trained_models import COPIED_FROM, SHIPPED, copy
from tests.support import ties

ROOT = Path(__file__).resolve().parents[2]
LOSSLESS = {"diffusion_self", "diffusion_self_quadratic", "jacobi", "wedlm_spec"}
# Measured with `python -m scripts.evaluate --models scripts/trained` (docs/checkpoints.md), less 0.03 for another CPU.
FLOORS = {
    ("nld", "diffusion_self"): 1.26,
    ("nld", "diffusion_self_quadratic"): 1.58,
    ("nld", "diffusion"): 2.63,
    ("wedlm", "wedlm"): 2.05,  # measured 2.08: issue 16 set 2.0
    ("wedlm", "wedlm_spec"): 1.33,
    ("jacobi_forcing", "jacobi"): 2.0,  # measured 2.11: the floor issue 16 set
    ("ar", "jacobi"): 1.53,
}


@cache
def scores(checkpoint: str, method: str, preset: str) -> quality.MethodScore:
    return quality.score(SHIPPED / checkpoint, method, preset, corpus.prompts(24), 64)


def test_documented_command_copies_every_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, "-m", "scripts.trained_models", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in OBJECTIVES:
        weights = "model.safetensors"
        assert (tmp_path / name / weights).read_bytes() == (SHIPPED / name / weights).read_bytes()
    assert (tmp_path / "nld" / "linear_spec_lora" / "adapter_model.safetensors").is_file()


def test_copy_replaces_stale_copies_only(tmp_path, capsys):
    """A copy made from older shipped weights is replaced; a current copy and a checkpoint that is no copy (a user's
    own, `--retrain`'s) are left as they are, the latter with a note."""
    copy(tmp_path)
    (tmp_path / "ar" / "model.safetensors").write_bytes(b"older weights")
    (tmp_path / "ar" / COPIED_FROM).write_text("0" * 64)
    (tmp_path / "nld" / COPIED_FROM).unlink()
    (tmp_path / "nld" / "model.safetensors").write_bytes(b"own weights")
    (tmp_path / "wedlm" / "extra.txt").write_text("kept")
    copy(tmp_path)
    weights = "model.safetensors"
    assert (tmp_path / "ar" / weights).read_bytes() == (SHIPPED / "ar" / weights).read_bytes()
    assert (tmp_path / "nld" / weights).read_bytes() == b"own weights"
    assert (tmp_path / "wedlm" / "extra.txt").read_text() == "kept"
    assert "nld is not the shipped nld checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("checkpoint,method,preset", quality.PRESETS, ids=[f"{c}-{m}" for c, m, _ in quality.PRESETS])
def test_tokens_per_forward_on_held_out_prompts(checkpoint, method, preset):
    score = scores(checkpoint, method, preset)
    assert score.tokens_per_forward >= FLOORS[checkpoint, method], score.summary()
    if method in LOSSLESS:
        ties.compare(score.outputs, score.reference, score.reference_margins)
        if score.outputs == score.reference:  # the same text reads the same to its model
            assert score.bits_per_token == pytest.approx(score.reference_bits_per_token, abs=1e-6)
    else:  # an approximate sampler's text costs likelihood against greedy AR's
        assert score.bits_per_token > score.reference_bits_per_token, score.summary()


def test_output_bits_are_the_causal_loss_of_the_generated_tokens():
    model, _ = load(SHIPPED / "ar")
    prompts, outputs = [[5, 6, 7], [8, 9]], [[10, 11], [12]]
    with torch.inference_mode():
        nats = 0.0
        for prompt, output in zip(prompts, outputs, strict=True):
            ids = prompt + output
            logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
            nats -= sum(logp[i - 1, ids[i]].item() for i in range(len(prompt), len(ids)))
    assert quality.output_bits(model, prompts, outputs) == pytest.approx(nats / math.log(2) / 3, rel=1e-5)


def test_jacobi_forcing_training_earns_jacobi_forwards():
    trained = scores("jacobi_forcing", "jacobi", "tiny-jacobi-forcing.json").tokens_per_forward
    base = scores("ar", "jacobi", "tiny-jacobi-forcing.json").tokens_per_forward
    assert trained > base + 0.1, (trained, base)


def test_trained_raven_wavefront_saves_core_passes():
    """The shipped recurrent-depth checkpoint's latents converge: on held-out prompts at r = 32 the wavefront takes
    at least 4x fewer sequential core passes per token than `ar` (measured 6.55x on 8 prompts x 48 tokens) and
    mostly agrees with it; `adaptive` saves passes too, and `speculative` equals `ar` on its cache."""
    report = huginn.run(str(SHIPPED / "raven"), 32, 4, 32)
    rows = report["samplers"]
    assert report["convergence"][31] < 0.01  # relative latent change per recurrence at r = 32
    assert rows["wavefront"]["passes_saved_vs_ar"] >= 4 and rows["wavefront"]["agreement_with_ar"] >= 0.9, rows
    assert rows["adaptive"]["passes_saved_vs_ar"] >= 3 and rows["adaptive"]["agreement_with_ar"] >= 0.9, rows
    assert rows["speculative"]["agreement_with_ar"] == 1.0 and rows["speculative"]["passes_saved_vs_ar"] > 1.5


def test_trained_asarm_needs_fewer_model_calls_than_sequential():
    """The shipped any-subset AR model's self-drafts are accepted: on held-out text (128 tokens, T = 1, k = 5) ASSD
    takes well under sequential decoding's model calls, continuing a 5% prompt and filling 95% holes in a random
    order (measured 0.78 and 0.43 of sequential's calls on 2 samples); never more calls than tokens (Theorem 1)."""
    report = assd.run(str(SHIPPED / "asarm"), [128], 2, 5, 1.0)
    rows = {(r["task"], r["drafter"]): r for r in report["runs"]}
    assert rows["continuation", "self"]["nfe_vs_sequential"] < 0.8, rows
    assert rows["infilling", "self"]["nfe_vs_sequential"] < 0.6, rows
    assert all(r["nfe"] <= r["generated"] for r in rows.values())
