"""The cost of structured output: each method in the reference runner on the real model (SmolLM2-135M-Instruct,
float32, its draft adapter) over the 40 requests of `scripts.structured_requests`, with and without their
constraints: valid outputs, tokens per forward and tokens/s, and for the lossless methods how many equal AR's."""

import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from parallel_decoding.common.checkpoint import eos_token_ids, load
from parallel_decoding.common.diffusion_self import DRAFT_ADAPTER
from parallel_decoding.common.lora import LoRA
from parallel_decoding.common.methods import parse_config
from parallel_decoding.common.runner import ReferenceRunner
from scripts import smollm2
from scripts.structured_requests import Grammars, decode, requests

METHODS = {
    "ar": ("ar", {}),
    "jacobi": ("jacobi", {"block_size": 8, "pool_size": 4}),
    "diffusion_self": ("diffusion_self", {"num_speculative_tokens": 8, "draft_adapter": smollm2.ADAPTER_DIR}),
    "diffusion_self_quadratic": ("diffusion_self", {"mode": "quadratic", "num_speculative_tokens": 3,
                                                    "draft_adapter": smollm2.ADAPTER_DIR}),
    "wedlm_spec": ("wedlm_spec", {"window": 4}),
    "wedlm": ("wedlm", {"window": 8}),
    "diffusion": ("diffusion", {"block_size": 8}),
}
LOSSLESS = ("jacobi", "diffusion_self", "diffusion_self_quadratic", "wedlm_spec")


def complete(grammars: Grammars, constraint: dict, tokens: list[int], max_tokens: int) -> bool:
    """Whether `tokens` is valid under `constraint`: accepted throughout, and ended unless cut at `max_tokens`."""
    accepted, ended, _ = grammars.walk(constraint, tokens)
    return accepted and (ended or len(tokens) == max_tokens)


def run(model: str | None = None, prompts: int = 40, device: str = "cpu") -> list[dict[str, Any]]:
    """Per method and setting (constrained or free) over `prompts` requests (half JSON schemas, half regexes):
    valid outputs, tokens per forward, tokens/s and (lossless) outputs equal to AR's in the same setting; printed as
    a table."""
    path = smollm2.ensure() if model is None else Path(model)
    loaded, tokenizer = load(path, device=device)
    runner = ReferenceRunner(loaded, adapters={DRAFT_ADAPTER: LoRA(loaded, path / smollm2.ADAPTER_DIR).enabled})
    grammars, eos = Grammars(path, loaded.config.vocab_size), eos_token_ids(loaded, tokenizer)
    work = requests(path)
    work = work[: prompts // 2] + work[20 : 20 + prompts - prompts // 2]
    outputs: dict[tuple[str, bool], list[list[int]]] = {}
    rows = []
    for name, (method, settings) in tqdm(METHODS.items(), desc="methods"):
        config = parse_config(method, settings, mask_token_id=loaded.config.mask_token_id,
                              **({"dlm_type": "dream"} if method != "ar" else {}))
        for constrained in (True, False):
            start, results = time.perf_counter(), []
            for prompt, constraint, max_tokens in work:
                results.append(decode(runner, grammars, method, config, prompt, constraint if constrained else None,
                                      max_tokens, eos))
            seconds = time.perf_counter() - start
            tokens = [r.token_ids for r in results]
            outputs[name, constrained] = tokens
            valid = sum(complete(grammars, c, t, n) for (_, c, n), t in zip(work, tokens, strict=True))
            generated = sum(map(len, tokens))
            rows.append({"method": name, "constrained": constrained, "valid": valid, "requests": len(work),
                         "tokens_per_forward": round(generated / sum(r.forwards for r in results), 3),
                         "tokens_per_s": round(generated / seconds, 1),
                         "equal_to_ar": sum(a == b for a, b in zip(tokens, outputs["ar", constrained], strict=True))
                         if name in LOSSLESS else None})
    print(f"{'method':<26} {'grammar':>7} {'valid':>6} {'tok/fwd':>8} {'tok/s':>7} {'= AR':>5}")
    for row in rows:
        same = "" if row["equal_to_ar"] is None else f"{row['equal_to_ar']}/{row['requests']}"
        print(f"{row['method']:<26} {'yes' if row['constrained'] else 'no':>7} {row['valid']:>3}/{row['requests']} "
              f"{row['tokens_per_forward']:>8.2f} {row['tokens_per_s']:>7.1f} {same:>5}")
    return rows
