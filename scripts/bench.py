"""Benchmark parallel decoders in a serving engine against its own AR decoding: tokens/s and tokens per forward.

    python -m scripts.bench --engine vllm --model DIR --json OUT.json [--png OUT.png] [--max-tokens 64]
    .venv-sglang/bin/python -m scripts.bench --engine sglang --model DIR --json OUT.json

Writes a list of records {engine, method, config, batch_size, tokens_per_second, tokens_per_forward, p_cache,
speedup, acceptance_length}. Tokens per forward counts every model forward a request takes part in. For AR
and ngram it comes from vLLM's counters (each target forward yields 1 + accepted tokens); for our methods from
`common/`'s reference runner on the same prompts, whose decisions the engine paths reproduce token for token
(tested), since the engines do not count our extra forwards (drafts, reveals). p_cache is WeDLM's eq. 4.
Acceptance length is tokens per verify step (vLLM: per draft; SGLang: per speculative step after the prefill).
SGLang runs in its own environment (`scripts/setup_sglang_env.sh`), on CPU with `scripts.sglang_server`'s
settings (float32) when there is no GPU; it has no ngram here, and only SGLang runs `jacobi_recycling`.
"""

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

METHODS = [
    ("ar", None),
    ("ngram", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}),
    ("diffusion_self", {"method": "diffusion_self", "num_speculative_tokens": 8}),
    ("jacobi", {"method": "jacobi", "block_size": 8}),
    ("jacobi_recycling", {"method": "jacobi", "block_size": 8, "pool_size": 8, "verification_size": 4}),
    ("wedlm", {"method": "wedlm", "window": 8, "entropy_threshold": 0.4, "distance_penalty": 0.02}),
    ("diffusion", {"method": "diffusion", "block_size": 8, "confidence_threshold": 0.9}),
]
# Methods one engine lacks: SGLang has no ngram here, vLLM's verifier takes no recycled branches.
ONE_ENGINE = {"ngram": "vllm", "jacobi_recycling": "sglang"}
PROMPTS = [
    "def wrap(text, width=70):", "import heapq\n", "class Formatter:", "    def __init__(self, ",
    "def bisect_left(a, x, lo=0, hi=None):", "for line in lines:", "    return ''.join(", "if __name__ == '__main__':",
]


def run_vllm(model: str, spec: dict | None, batch_size: int, max_tokens: int, rounds: int) -> dict:
    """Generate `rounds` batches of `batch_size` prompts; measure after one warm-up batch.

    The engine core runs in its own process (vLLM's default), so engines of several methods follow each other.
    """
    from vllm import LLM, SamplingParams

    from vllm_plugin.metrics import acceptance

    llm = LLM(model=model, speculative_config=spec, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
              max_model_len=512, max_num_seqs=batch_size, disable_log_stats=False, seed=0)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    batches = [[PROMPTS[(r * batch_size + i) % len(PROMPTS)] for i in range(batch_size)] for r in range(rounds)]
    llm.generate(batches[0], params, use_tqdm=False)
    before = acceptance(llm) if spec else None
    start, tokens = time.perf_counter(), 0
    for batch in batches:
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False))
    seconds = time.perf_counter() - start
    drafts = accepted = 0
    if spec:
        after = acceptance(llm)
        drafts = after.num_drafts - before.num_drafts
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
    del llm
    return {
        "tokens_per_second": tokens / seconds,
        "tokens_per_forward": tokens / (tokens - accepted) if accepted < tokens else None,
        "p_cache": None if spec else 1.0,
        "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "tokens": tokens,
        "seconds": seconds,
    }


def run_sglang(model: str, spec: dict | None, batch_size: int, max_tokens: int, rounds: int) -> dict:
    """As `run_vllm`, on an offline `sglang.Engine` selecting the method with `decode_mode` / `decode_config`."""
    import os

    import torch

    from scripts.sglang_server import CPU_KWARGS, cpu_env

    if not torch.cuda.is_available():
        os.environ.update(cpu_env())
    import sglang

    kwargs = {} if torch.cuda.is_available() else dict(CPU_KWARGS)
    if spec is not None:
        kwargs.update(decode_mode=spec["method"], decode_config={k: v for k, v in spec.items() if k != "method"})
    engine = sglang.Engine(model_path=model, max_running_requests=batch_size, random_seed=0, **kwargs)
    params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
    batches = [[PROMPTS[(r * batch_size + i) % len(PROMPTS)] for i in range(batch_size)] for r in range(rounds)]
    try:
        engine.generate(batches[0], params)
        start, outputs = time.perf_counter(), []
        for batch in batches:
            outputs += engine.generate(batch, params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    tokens = sum(out["meta_info"]["completion_tokens"] for out in outputs)
    steps = sum(out["meta_info"].get("spec_verify_ct") or 0 for out in outputs)
    return {
        "tokens_per_second": tokens / seconds,
        "tokens_per_forward": None if spec else 1.0,
        "p_cache": None if spec else 1.0,
        "acceptance_length": (tokens - len(outputs)) / steps if steps else 1.0,
        "tokens": tokens,
        "seconds": seconds,
    }


def reference_costs(model_dir: str, spec: dict, max_tokens: int) -> dict:
    """Tokens per forward and p_cache of one of our methods, from `common/`'s reference runner (greedy)."""
    from common.checkpoint import load, resolve_mask_token_id
    from common.decoder import Limits
    from common.draft_layout import resolve_dlm_type
    from common.methods import make_decoder, needs_mask_token, parse_config
    from common.runner import ReferenceRunner
    from common.sampling import SamplingParams

    model, tokenizer = load(model_dir)
    settings = {k: v for k, v in spec.items() if k != "method"}
    mask_id = resolve_mask_token_id(model.config, tokenizer) if needs_mask_token(spec["method"]) else None
    config = resolve_dlm_type(parse_config(spec["method"], settings, mask_token_id=mask_id), model.config)
    tokens = forwards = generated = rows = 0
    for prompt in PROMPTS:
        decoder = make_decoder(spec["method"], config, tokenizer.encode(prompt), SamplingParams(), Limits(max_tokens))
        ReferenceRunner(model).run(decoder)
        tokens, forwards = tokens + len(decoder.output), forwards + decoder.forwards
        generated, rows = generated + len(decoder.output) - decoder.prefill_tokens, rows + decoder.decode_rows
    return {"tokens_per_forward": tokens / forwards, "p_cache": generated / max(rows, 1)}


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in records))
    sizes = sorted({r["batch_size"] for r in records})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("tokens_per_second", "tokens_per_forward"), strict=True):
        width = 0.8 / len(sizes)
        for j, size in enumerate(sizes):
            values = [next(r[key] for r in records if r["method"] == m and r["batch_size"] == size) for m in methods]
            ax.bar([i + j * width for i in range(len(methods))], values, width, label=f"batch {size}")
        ax.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(methods))], methods)
        ax.set_title(key.replace("_", " "))
        ax.legend()
    fig.suptitle(f"{records[0]['engine']}: {records[0]['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--png", default=None, help="bar charts of tokens/s and tokens per forward")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="timed batches per method and batch size")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--methods", default=",".join(name for name, _ in METHODS),
                        help="comma-separated subset of the methods; ar, the baseline, always runs first")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    records = []
    for size in sizes:
        baseline = None
        chosen = [(name, spec) for name, spec in METHODS if (name == "ar" or name in args.methods.split(","))
                  and ONE_ENGINE.get(name, args.engine) == args.engine]
        run = run_vllm if args.engine == "vllm" else run_sglang
        for name, spec in tqdm(chosen, desc=f"batch {size}"):
            result = run(args.model, spec, size, args.max_tokens, args.rounds)
            if spec is not None and spec["method"] != "ngram":
                result.update(reference_costs(args.model, spec, args.max_tokens))
            baseline = baseline or result["tokens_per_second"]
            records.append({"engine": args.engine, "model": args.model, "method": name, "config": spec,
                            "batch_size": size, **result, "speedup": result["tokens_per_second"] / baseline})
    Path(args.json).write_text(json.dumps(records, indent=1))
    print(f"{'method':<16}{'batch':>6}{'tok/s':>10}{'tok/fwd':>9}{'p_cache':>9}{'accept len':>11}{'speedup':>9}")
    for r in records:
        p_cache = "-" if r["p_cache"] is None else f"{r['p_cache']:.2f}"
        print(f"{r['method']:<16}{r['batch_size']:>6}{r['tokens_per_second']:>10.1f}{r['tokens_per_forward']:>9.2f}"
              f"{p_cache:>9}{r['acceptance_length']:>11.2f}{r['speedup']:>9.2f}")
    if args.png:
        plot(records, args.png)


if __name__ == "__main__":
    main()
