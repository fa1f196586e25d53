"""Huginn's samplers served by vLLM (in-process engine, greedy, held-out prompts) at several batch sizes: tokens/s,
speedup over the engine's `ar` at the same r, sequential core passes per generated token of a request (the cost
that sets a step's latency on a GPU; the batch shares each pass), and agreement with the engine's `ar`; JSON + PNG.

    python -m scripts.huginn_vllm_bench --model DIR [--num-steps 32] [--batch-sizes 1,8] [--max-tokens 48] \\
        [--json out/huginn-vllm.json] [--png out/huginn-vllm.png]
"""

import argparse
import json
import os
import time
from pathlib import Path

from tqdm import tqdm

from scripts import corpus

SAMPLERS = ("ar", "adaptive", "wavefront")


def run_sampler(model_dir: str, settings: dict, prompts: list[list[int]], max_tokens: int) -> dict:
    """One engine; a warm-up batch, then the measured one."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, so the model's pass counter is readable
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model_dir, speculative_config={"method": "huginn", **settings}, enforce_eager=True,
              dtype="float32", max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0, skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(batch, params, use_tqdm=False)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    passes, start = model.core_passes, time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    seconds, passes = time.perf_counter() - start, model.core_passes - passes
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    total = sum(len(t) for t in tokens)
    del llm
    return {"tokens": tokens, "tokens_per_second": total / seconds,
            "core_passes_per_token": passes * len(prompts) / total}


def run(model_dir: str, num_steps: int, batch_sizes: list[int], max_tokens: int) -> dict:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p) for p in corpus.prompts(max(batch_sizes))]
    report: dict = {"model": model_dir, "engine": "vllm", "num_steps": num_steps, "max_tokens": max_tokens,
                    "records": []}
    for batch_size in tqdm(batch_sizes, desc="batch sizes"):
        rows = {name: run_sampler(model_dir, {"sampler": name, "num_steps": num_steps}, prompts[:batch_size],
                                  max_tokens) for name in tqdm(SAMPLERS, desc="samplers", leave=False)}
        ar = rows["ar"]
        for name, row in rows.items():
            same = sum(a == b for got, want in zip(row["tokens"], ar["tokens"], strict=True)
                       for a, b in zip(got, want, strict=True))
            report["records"].append({
                "sampler": name, "batch_size": batch_size, "tokens_per_second": row["tokens_per_second"],
                "speedup": row["tokens_per_second"] / ar["tokens_per_second"],
                "core_passes_per_token": row["core_passes_per_token"],
                "agreement_with_ar": same / sum(len(t) for t in ar["tokens"])})
    return report


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = sorted({r["batch_size"] for r in report["records"]})
    for name in SAMPLERS:
        rows = [r for r in report["records"] if r["sampler"] == name]
        left.plot(sizes, [r["speedup"] for r in rows], marker="o", label=name)
        right.plot(sizes, [r["core_passes_per_token"] for r in rows], marker="o", label=name)
    left.set(xlabel="batch size", ylabel="tokens/s over vLLM ar", xscale="log", title="vLLM, CPU")
    right.set(xlabel="batch size", ylabel="sequential core passes per token", xscale="log",
              title=f"r = {report['num_steps']}")
    left.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.huginn_vllm_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-steps", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    report = run(args.model, args.num_steps, [int(b) for b in args.batch_sizes.split(",")], args.max_tokens)
    print(f"{'sampler':<10} {'batch':>5} {'tok/s':>7} {'speedup':>8} {'passes/token':>12} {'= ar':>6}")
    for r in report["records"]:
        print(f"{r['sampler']:<10} {r['batch_size']:>5} {r['tokens_per_second']:>7.1f} {r['speedup']:>8.2f} "
              f"{r['core_passes_per_token']:>12.2f} {r['agreement_with_ar']:>6.0%}")
    for name, target in (("json", args.json), ("png", args.png)):
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            if name == "json":
                Path(target).write_text(json.dumps(report, indent=1) + "\n")
            else:
                plot(report, target)


if __name__ == "__main__":
    main()
