"""`scripts.trajectory`: every generated token is committed exactly once, at the forward that committed it, and the
documented command writes the picture."""

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.trained_models import SHIPPED
from scripts.trajectory import trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("checkpoint,method,preset", [
    ("jacobi_forcing", "jacobi", "tiny-jacobi-forcing.json"),
    ("nld", "diffusion", "tiny-nld-diffusion.json"),
    ("nld", "diffusion_self", "tiny-nld-self-spec.json"),
    ("wedlm", "wedlm", "tiny-wedlm.json"),
])
def test_each_token_committed_once(checkpoint, method, preset):
    cells, final, _ = trace(str(SHIPPED / checkpoint), method, str(ROOT / "configs" / preset), "import heapq", 24)
    committed = sorted((c.slot, c.token) for c in cells if c.kind == "committed")
    assert committed == list(enumerate(final)) and len(final) == 24
    steps = [c.step for c in sorted(cells, key=lambda c: c.slot) if c.kind == "committed"]
    assert steps == sorted(steps)  # committed left to right
    assert any(c.kind != "committed" for c in cells)  # drafts, fills or masks are shown too


def test_documented_command_writes_png(tmp_path):
    png = tmp_path / "t.png"
    out = subprocess.run([sys.executable, "-m", "scripts.trajectory", "--model", str(SHIPPED / "jacobi_forcing"),
                          "--method", "jacobi", "--max-tokens", "8", "--png", str(png)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
