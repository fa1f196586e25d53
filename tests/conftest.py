"""Shared fixtures: tiny local checkpoints built once per session, and prompts from the standard library."""

import sysconfig
from pathlib import Path

import pytest
import torch

from parallel_decoding.common.checkpoint import load
from scripts.make_tiny_models import build_model, make_all

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-models")
    make_all(root)
    return root


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny checkpoints with head size 32, the smallest the engines' CPU attention kernels run."""
    return make_all(tmp_path_factory.mktemp("engine-models"), hidden_size=128)


@pytest.fixture(scope="session")
def vocab8(tmp_path_factory: pytest.TempPathFactory):
    """A vocabulary-8 model (head size 32, no tokenizer) saved for the engines, and the model itself, whose exact
    joint over short continuations the sampling tests compare against."""
    from tests.support.exact import MASK, VOCAB

    model = build_model("qwen3", VOCAB, MASK, eos_token_id=None, seed=3, hidden_size=128)
    path = tmp_path_factory.mktemp("vocab8")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="session")
def cyclic(tmp_path_factory: pytest.TempPathFactory):
    """A vocabulary-64 model whose greedy output walks 7-token cycles (head size 32, no tokenizer), saved for the
    engines, the model itself, and 8 random prompts of 2-8 token ids."""
    import random

    from scripts.make_tiny_models import build_cyclic_model

    model = build_cyclic_model()
    path = tmp_path_factory.mktemp("cyclic")
    model.save_pretrained(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(model.config.vocab_size - 1) for _ in range(rng.randrange(2, 9))] for _ in range(8)]
    return path, model, prompts


@pytest.fixture(scope="session", params=["qwen3", "qwen2", "llama"])
def tiny(request: pytest.FixtureRequest, tiny_dir: Path):
    """(model, tokenizer) for each tiny family."""
    return load(tiny_dir / request.param)


@pytest.fixture(scope="session")
def qwen3(tiny_dir: Path):
    return load(tiny_dir / "qwen3")


def stdlib_prompts(count: int = 32) -> list[str]:
    """Distinct non-empty source lines of a standard-library module the tokenizer was not trained on."""
    lines = (Path(sysconfig.get_paths()["stdlib"]) / "random.py").read_text(encoding="utf-8").splitlines()
    seen: list[str] = []
    for line in lines:
        text = line.strip()
        if len(text) > 12 and text not in seen:
            seen.append(text)
    return seen[:: max(len(seen) // count, 1)][:count]


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return stdlib_prompts()


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct, fetched and converted once (`scripts.smollm2`)."""
    from scripts import smollm2

    return smollm2.ensure()


@pytest.fixture(scope="session")
def chats(real_model: Path) -> list[list[int]]:
    """Ten held-out chat prompts rendered with the real model's chat template, as token ids."""
    from transformers import AutoTokenizer

    from scripts import chat_prompts

    tokenizer = AutoTokenizer.from_pretrained(real_model)
    return [chat_prompts.render(tokenizer, p) for p in chat_prompts.sample("heldout", 10)]


def pytest_terminal_summary(terminalreporter) -> None:
    """How many compared sequences were cut at a float32 near-tie (`tests/support/ties.py`)."""
    from tests.support.ties import TALLY

    if TALLY.sequences:
        terminalreporter.write_line(f"tie-aware comparisons: {TALLY.cut} of {TALLY.sequences} sequences cut at a tie")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """CI runs every setting on the qwen3 family and the first setting CI runs of each method (or test) on the other
    tiny families; their other settings are sweeps (`-m sweep`)."""
    seen: set[tuple] = set()
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params or params.get("tiny", "qwen3") == "qwen3" or item.get_closest_marker("sweep"):
            continue
        key = (item.module.__name__, item.originalname, params["tiny"], params.get("method"))
        if key in seen:
            item.add_marker(pytest.mark.sweep)
        seen.add(key)
