"""`scripts.bench --model huginn`'s runs: Huginn's samplers on a Raven checkpoint served by vLLM or SGLang (offline,
greedy, held-out prompts), each against the same engine's `ar` at the same r. A helper of `scripts.bench`, not a
command of its own."""

import os
import time

from tqdm import tqdm

from scripts import corpus

SAMPLERS = ("ar", "adaptive", "wavefront")


def settings(sampler: str, num_steps: int, max_diffusion_steps: int | None) -> dict:
    """One sampler's engine config at r = `num_steps`, the wavefront's steps bounded where asked (a Raven whose
    latents hardly converge can otherwise run thousands of steps a request)."""
    bound = {"max_diffusion_steps": max_diffusion_steps} if sampler == "wavefront" and max_diffusion_steps else {}
    return {"method": "huginn", "sampler": sampler, "num_steps": num_steps, **bound}


def run_vllm(model_dir: str, spec: dict, batches: list[list[list[int]]], max_tokens: int) -> dict:
    """One in-process engine (its model's core-pass counter is readable): a warm-up batch, then the timed ones."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model_dir, speculative_config=spec, enforce_eager=True, dtype="float32", max_model_len=512,
              kv_cache_memory_bytes=256 << 20, seed=0, skip_tokenizer_init=True)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    requests = [[TokensPrompt(prompt_token_ids=p) for p in batch] for batch in batches]
    llm.generate(requests[0], params, use_tqdm=False)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    passes, start, tokens = model.core_passes, time.perf_counter(), []
    for batch in requests:
        tokens += [list(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False)]
    seconds, passes = time.perf_counter() - start, model.core_passes - passes
    del llm
    return {"token_ids": tokens, "seconds": seconds, "core_passes": passes}


def run_sglang(model_dir: str, spec: dict, batches: list[list[list[int]]], max_tokens: int) -> dict:
    """One engine on CPU (`scripts.sglang_server`'s settings, float32): a warm-up batch, then the timed ones. It
    counts no core passes."""
    import sglang

    from scripts.sglang_server import CPU_KWARGS, cpu_env

    os.environ.update(cpu_env())
    engine = sglang.Engine(model_path=model_dir, decode_mode="huginn",
                           decode_config={k: v for k, v in spec.items() if k != "method"}, **CPU_KWARGS)
    params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
    try:
        engine.generate(input_ids=batches[0], sampling_params=params)
        start, tokens = time.perf_counter(), []
        for batch in batches:
            tokens += [out["output_ids"] for out in engine.generate(input_ids=batch, sampling_params=params)]
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    return {"token_ids": tokens, "seconds": seconds, "core_passes": None}


def agreement(token_ids: list[list[int]], ar_ids: list[list[int]]) -> float:
    """Share of `ar`'s tokens that a sampler gives at the same position of the same request."""
    same = sum(a == b for got, want in zip(token_ids, ar_ids, strict=True) for a, b in zip(got, want, strict=True))
    return same / sum(len(t) for t in ar_ids)


def record(engine: str, spec: dict, batch_size: int, run: dict, ar: dict) -> dict:
    """A bench record of one sampler's run beside `ar`'s on the same batches. Core passes per token are sequential
    passes per generated token of a request (the batch shares each pass; they set a step's latency on a GPU)."""
    tokens = sum(len(t) for t in run["token_ids"])
    passes = None if run["core_passes"] is None else run["core_passes"] * batch_size / tokens
    return {"engine": engine, "checkpoint": "raven", "method": spec["sampler"], "config": spec,
            "batch_size": batch_size, "tokens_per_second": tokens / run["seconds"], "tokens": tokens,
            "seconds": run["seconds"],
            "speedup": tokens / run["seconds"] / (sum(len(t) for t in ar["token_ids"]) / ar["seconds"]),
            "core_passes_per_token": passes, "agreement_with_ar": agreement(run["token_ids"], ar["token_ids"])}


def bench(engine: str, model_dir: str, batch_sizes: list[int], max_tokens: int, rounds: int, num_steps: int,
          max_diffusion_steps: int | None = None) -> list[dict]:
    """Every sampler at every batch size on `rounds` batches of held-out prompts."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p) for p in corpus.prompts(max(batch_sizes) * rounds)]
    run = run_vllm if engine == "vllm" else run_sglang
    records = []
    for size in tqdm(batch_sizes, desc=f"{engine} huginn bench"):
        batches = [[prompts[(r * size + i) % len(prompts)] for i in range(size)] for r in range(rounds)]
        specs = [settings(name, num_steps, max_diffusion_steps) for name in SAMPLERS]
        runs = [run(model_dir, spec, batches, max_tokens) for spec in tqdm(specs, desc="samplers", leave=False)]
        records += [record(engine, spec, size, result, runs[0]) for spec, result in zip(specs, runs, strict=True)]
    return records


def show(records: list[dict]) -> None:
    """The records as a table on stdout."""
    print(f"{'sampler':<10} {'batch':>5} {'tok/s':>7} {'speedup':>8} {'passes/token':>12} {'= ar':>6}")
    for r in records:
        passes = "-" if r["core_passes_per_token"] is None else f"{r['core_passes_per_token']:.2f}"
        print(f"{r['method']:<10} {r['batch_size']:>5} {r['tokens_per_second']:>7.1f} {r['speedup']:>8.2f} "
              f"{passes:>12} {r['agreement_with_ar']:>6.0%}")


def plot(records: list[dict], path: str) -> None:
    """Speedup over `ar` and core passes per token (vLLM) against the batch size, a line per sampler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    engine, num_steps = records[0]["engine"], records[0]["config"]["num_steps"]
    for name in SAMPLERS:
        rows = [r for r in records if r["method"] == name]
        sizes = [r["batch_size"] for r in rows]
        left.plot(sizes, [r["speedup"] for r in rows], marker="o", label=name)
        if rows[0]["core_passes_per_token"] is not None:
            right.plot(sizes, [r["core_passes_per_token"] for r in rows], marker="o", label=name)
    left.set(xlabel="batch size", ylabel=f"tokens/s over {engine} ar", xscale="log", title=engine)
    right.set(xlabel="batch size", ylabel="sequential core passes per token", xscale="log", title=f"r = {num_steps}")
    left.legend()
    fig.tight_layout()
    fig.savefig(path)
