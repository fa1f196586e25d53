"""`scripts.sol`: serial denoising takes one forward per slot, compaction never takes more forwards than serial
denoising nor more than an exact greedy acceptance, and the documented command prints the table."""

import subprocess
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

from parallel_decoding.common.checkpoint import load
from parallel_decoding.common.draft_layout import draft_rows
from scripts import corpus
from scripts.sol import Block, compaction, greedy, serial
from scripts.trained_models import SHIPPED

ROOT = Path(__file__).resolve().parents[2]


@torch.inference_mode()
def test_compaction_bounds():
    model, tokenizer = load(SHIPPED / "nld")
    mask_id, size = tokenizer.mask_token_id, 7
    better = 0
    for prompt in corpus.prompts(6):
        ids = tokenizer.encode(prompt)
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
        block = Block(model, cache, len(ids) - 1, ids[-1], mask_id, draft_rows(size, "llada"))
        target = torch.tensor(serial(block, size))
        assert block.forwards == size and mask_id not in target.tolist()
        used, exact = greedy(block, torch.full_like(target, mask_id), target, 5000)
        sol = compaction(block, target)
        assert 1 <= sol <= size
        if exact:
            assert sol <= used
        better += sol < size
    assert better >= 3  # the trained checkpoint commits several slots per forward on most blocks


def test_documented_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "scripts.sol", "--model", str(SHIPPED / "nld"), "--block-sizes", "4",
                          "--prompts", "2", "--blocks", "1", "--png", str(tmp_path / "sol.png")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].split()[0] == "4" and (tmp_path / "sol.png").stat().st_size > 0
