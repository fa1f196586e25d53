"""Huginn's samplers served by an engine (offline, greedy, held-out prompts) at several batch sizes: tokens/s,
speedup over the same engine's `ar` at the same r, agreement with its `ar`, and (vLLM, whose engine runs in this
process) sequential core passes per generated token of a request (the cost that sets a step's latency on a GPU;
the batch shares each pass); JSON + PNG.

    python -m scripts.huginn_engine_bench --engine vllm --model DIR [--num-steps 32] [--batch-sizes 1,8] \\
        [--max-tokens 48] [--json out/huginn-vllm.json] [--png out/huginn-vllm.png]
    .venv-sglang/bin/python -m scripts.huginn_engine_bench --engine sglang --model DIR --json out/huginn-sglang.json
"""

import argparse
import json
import os
import time
from pathlib import Path

from tqdm import tqdm

from scripts import corpus

SAMPLERS = ("ar", "adaptive", "wavefront")


def run_vllm(model_dir: str, settings: dict, prompts: list[list[int]], max_tokens: int) -> dict:
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


def run_sglang(model_dir: str, settings: dict, prompts: list[list[int]], max_tokens: int) -> dict:
    """One engine (float32, CPU settings without a GPU); a warm-up batch, then the measured one."""
    import sglang

    from scripts.sglang_server import CPU_KWARGS, cpu_env

    os.environ.update(cpu_env())
    engine = sglang.Engine(model_path=model_dir, decode_mode="huginn", decode_config=settings, **CPU_KWARGS)
    params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
    try:
        engine.generate(input_ids=prompts, sampling_params=params)
        start = time.perf_counter()
        outputs = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    tokens = [out["output_ids"] for out in outputs]
    return {"tokens": tokens, "tokens_per_second": sum(len(t) for t in tokens) / seconds,
            "core_passes_per_token": None}


def run(engine: str, model_dir: str, num_steps: int, batch_sizes: list[int], max_tokens: int) -> dict:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p) for p in corpus.prompts(max(batch_sizes))]
    run_sampler = run_vllm if engine == "vllm" else run_sglang
    report: dict = {"model": model_dir, "engine": engine, "num_steps": num_steps, "max_tokens": max_tokens,
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
        if rows[0]["core_passes_per_token"] is not None:
            right.plot(sizes, [r["core_passes_per_token"] for r in rows], marker="o", label=name)
    left.set(xlabel="batch size", ylabel=f"tokens/s over {report['engine']} ar", xscale="log",
             title=f"{report['engine']}, CPU")
    right.set(xlabel="batch size", ylabel="sequential core passes per token", xscale="log",
              title=f"r = {report['num_steps']}")
    left.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.huginn_engine_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-steps", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    report = run(args.engine, args.model, args.num_steps, sizes, args.max_tokens)
    print(f"{'sampler':<10} {'batch':>5} {'tok/s':>7} {'speedup':>8} {'passes/token':>12} {'= ar':>6}")
    for r in report["records"]:
        passes = "-" if r["core_passes_per_token"] is None else f"{r['core_passes_per_token']:.2f}"
        print(f"{r['sampler']:<10} {r['batch_size']:>5} {r['tokens_per_second']:>7.1f} {r['speedup']:>8.2f} "
              f"{passes:>12} {r['agreement_with_ar']:>6.0%}")
    for name, target in (("json", args.json), ("png", args.png)):
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            if name == "json":
                Path(target).write_text(json.dumps(report, indent=1) + "\n")
            else:
                plot(report, target)


if __name__ == "__main__":
    main()
