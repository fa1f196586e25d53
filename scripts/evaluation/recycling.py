"""Jacobi's tokens per forward (the prefill and every verify forward) with and without rejection recycling, n = 16 / 32,
K = 1 / 2, greedy, in one runner: `common/`'s reference, vLLM offline (linear recycling only: its verifier takes one
draft) or SGLang's server; on the cyclic tiny model (8 random prompts) or a checkpoint (held-out prompts)."""

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from parallel_decoding.common.decoder import Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.runner import ReferenceRunner
from parallel_decoding.common.sampling import SamplingParams

MAX_TOKENS = 64
RECYCLING = {"reference": ("branches", "linear"), "vllm": ("linear",), "sglang": ("branches", "linear")}


def settings_grid(runner: str) -> list[dict]:
    """Jacobi's settings per (n, K): without the pool, and with it in each recycling mode `runner` serves."""
    grid = []
    for n in (16, 32):
        for k in (1, 2):
            plain = {"block_size": n, "num_blocks": k, "spawn_ratio": 0.85, "pool_size": 0}
            grid.append(plain)
            grid += [{**plain, "pool_size": 4, "verification_size": 4, "recycling": r} for r in RECYCLING[runner]]
    return grid


def workload(model_dir: str | None, root: Path) -> tuple[Path, Any, list[list[int]]]:
    """(checkpoint path, the model in this process, prompt token ids)."""
    if model_dir is None:
        from scripts.make_tiny_models import build_cyclic_model

        model = build_cyclic_model()
        model.save_pretrained(root / "cyclic")
        rng = random.Random(0)
        prompts = [[rng.randrange(model.config.vocab_size - 1) for _ in range(rng.randrange(2, 9))] for _ in range(8)]
        return root / "cyclic", model, prompts
    from parallel_decoding.common.checkpoint import load
    from scripts import corpus

    model, tokenizer = load(model_dir)
    return Path(model_dir), model, [tokenizer.encode(p) for p in corpus.prompts(16)]


def reference(model: Any, settings: dict | None, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Outputs and forwards of Jacobi with `settings` (greedy AR where None) in the reference runner."""
    config = None if settings is None else parse_config("jacobi", settings)
    runs = [ReferenceRunner(model).run(make_decoder("ar" if settings is None else "jacobi", config, p,
                                                    SamplingParams(), Limits(MAX_TOKENS))) for p in prompts]
    return [r.token_ids for r in runs], sum(r.forwards for r in runs)


def vllm(path: Path, settings: dict, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Outputs and forwards (drafts verified, and each prefill) of vLLM offline."""
    from tests.support.vllm_engine import engine  # isort: split
    from vllm import SamplingParams as VllmSampling
    from vllm import TokensPrompt

    from parallel_decoding.vllm_plugin.metrics import acceptance

    bare = not (path / "tokenizer.json").exists()
    with engine(path, {"method": "jacobi", **settings}, skip_tokenizer_init=bare) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               VllmSampling(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False),
                               use_tqdm=False)
        stats = acceptance(llm)
    return [list(o.outputs[0].token_ids) for o in outputs], stats.num_drafts + len(prompts)


def sglang(path: Path, settings: dict, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Outputs and forwards (verify steps, and each prefill) of SGLang's server."""
    from concurrent.futures import ThreadPoolExecutor

    from scripts.sglang_server import CPU_ARGS, sglang_server
    from tests.support.sglang_client import generate

    with (sglang_server(path, "jacobi", json.dumps(settings), [*CPU_ARGS, "--skip-tokenizer-init"]) as client,
          ThreadPoolExecutor(len(prompts)) as pool):
        got = list(pool.map(lambda p: generate(client, p, max_new_tokens=MAX_TOKENS, ignore_eos=True), prompts))
    return [out["output_ids"] for out in got], sum(out["meta_info"]["spec_verify_ct"] + 1 for out in got)


RUNNERS = {"reference": reference, "vllm": vllm, "sglang": sglang}


def run(runner: str = "reference", model: str | None = None) -> list[dict]:
    """Each setting of `settings_grid(runner)`: tokens per forward and how many outputs equal greedy AR's; printed."""
    with tempfile.TemporaryDirectory() as root:
        path, loaded, prompts = workload(model, Path(root))
        ar, _ = reference(loaded, None, prompts)
        rows = []
        for settings in tqdm(settings_grid(runner), desc=runner):
            outputs, forwards = RUNNERS[runner](loaded if runner == "reference" else path, settings, prompts)
            tokens = sum(map(len, outputs))
            same = sum(o == a[: len(o)] for o, a in zip(outputs, ar, strict=True))
            rows.append({**settings, "tokens_per_forward": round(tokens / forwards, 3), "equal_to_ar": same})
    print(f"{'n':>3} {'K':>2} {'pool':>4} {'recycling':>9} {'tok/fwd':>8} {'= AR':>5}")
    for row in rows:
        print(f"{row['block_size']:>3} {row['num_blocks']:>2} {row['pool_size']:>4} {row.get('recycling', '-'):>9} "
              f"{row['tokens_per_forward']:>8.2f} {row['equal_to_ar']:>3}/{len(prompts)}")
    return rows
