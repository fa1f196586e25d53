"""Benchmark parallel decoders in a serving engine, each on the checkpoint trained for it, against the same engine's
AR decoding of that checkpoint and (vLLM) its own `ngram` speculation at the same width.

    python -m scripts.bench --engine vllm --models DIR --json OUT.json [--png OUT.png] [--batch-sizes 1,8,32]
    .venv-sglang/bin/python -m scripts.bench --engine sglang --models DIR --json OUT.json
    python -m scripts.bench --engine vllm --models DIR --json OUT.json --quick    # batch 1, 16 tokens (CI)
    python -m scripts.bench --engine vllm --model smollm2 --json OUT.json         # the real model, chat prompts
    python -m scripts.bench --engine vllm --models DIR --json OUT.json --against-ar --repeats 3  # AR and method only
    python -m scripts.bench --engine vllm --models DIR --json OUT.json --against-ar --sync-ar  # and AR unpipelined
    python -m scripts.bench --engine reference --model smollm2 --batch-sizes 1 --json OUT.json [--device cuda]
    python -m scripts.bench --engine vllm --model huginn --json OUT.json [--num-steps 32] [--max-diffusion-steps N]

`--model smollm2` runs the lossless methods on SmolLM2-135M-Instruct (`scripts.smollm2`, fetched and converted once;
bf16 in vLLM, float32 in SGLang on CPU) with its presets (`configs/smollm2-*.json`, the shipped draft adapter) on
held-out chat prompts rendered with its chat template (`scripts.chat_prompts`).

`--models` holds the trained checkpoints (`scripts.trained_models`, copied there when missing). Writes a list of
records {engine, checkpoint, method, config, batch_size, tokens_per_second, tokens_per_forward, p_cache,
acceptance_length, acceptance_histogram, planner, speedup, speedups, conversion}. A method that chooses its widths
by load (`common.width_planner`, the default of `jacobi` and linear `diffusion_self`) also runs pinned to its
configured width (`NAME-fixed`, `"adaptive": false`), and its record has `over_fixed` (its speed over the pinned
width's, round by round in the same run: the median of its runs'; `over_fixed_runs`: each run's); `planner` is what
the planner chose and its fitted cost model (null where the method does not adapt). Speedup is over AR on the same
checkpoint and batch size in the same run.
The engines of a batch size and checkpoint (AR, the methods, their peers) are up at once, each in a process of its
own, and time one batch each in turn, round r starting from the r-th (`scripts.alternating`; this machine's pace
drifts by more than what is measured within minutes): a run's speedup is the median of its rounds' ratios to AR's
(`rounds_tokens_per_second`: each round's rate). `--repeats N` runs the whole plan N times in turn and keeps, per
record, the run with the median speedup (`speedups`: each run's). Conversion is speedup / tokens per forward (how
much of the forwards saved becomes time saved). Tokens per forward counts every model forward a request takes part
in: for AR and ngram from vLLM's counters (each target forward yields 1 + accepted tokens); for our methods from
`common/`'s reference runner on the same prompts at the configured width, whose decisions the engine paths reproduce
token for token (tested), since the engines do not count our extra forwards (drafts, reveals). p_cache is WeDLM's
eq. 4. `--sync-ar` (vLLM) adds `ar-sync`, AR without async scheduling, which vLLM 0.32 turns off for every plugin
speculative method (`docs/adaptive-widths.md`): the most a method's plain steps can reach on a GPU. On CPU vLLM runs
AR without it too (`async_scheduling` in each vLLM record), and `ar-sync` is AR again: the bench's own spread.
Acceptance length is tokens per verify step (vLLM: per draft; SGLang: per speculative step after the
prefill); the histogram counts verify steps by accepted drafts (vLLM only).
`--engine reference` times `common/`'s reference runner itself (transformers, one request at a time, so batch 1
only; the methods of a checkpoint each in a runner of its own, timing a request each in turn), on `--device` (a GPU
where there is one): what the methods' saved forwards become where a forward's cost hardly grows with its rows. A
method that adapts runs with `"adaptive": true` there (the reference runner's planner, `common.runner_widths`, which
it takes only when asked) beside its pinned width. Its tokens per forward are its own counts.
SGLang runs in its own environment (`scripts/setup_sglang_env.sh`), on CPU with `scripts.sglang_server`'s settings
(float32; every engine of a run with the same KV pool) when there is no GPU; it has no ngram here, and only SGLang
runs `jacobi_recycling` (candidates verified as branches beside the drafts; `jacobi` recycles linearly on both
engines).

`--model huginn` runs Huginn's samplers (`ar`, `adaptive`, `wavefront`, at r = `--num-steps`) on the Raven of
`--models` (`raven`, the shipped trained one unless a checkpoint of your own is there), served by vLLM or SGLang (on
CPU) with held-out prompts (`scripts.corpus`; `scripts.bench_huginn`): records {engine, checkpoint, method (the
sampler), config, batch_size, tokens_per_second, tokens, seconds, speedup over `ar` at the same r,
core_passes_per_token (vLLM: sequential core passes per generated token of a request, which set a step's latency on
a GPU), agreement_with_ar}; the plot is speedup and core passes against the batch size. `--max-diffusion-steps`
bounds the wavefront's steps a request (a Raven whose latents hardly converge can run thousands).
"""

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.alternating import alternate
from scripts.trained_models import copy

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def preset(name: str, **overrides) -> dict:
    return {**json.loads((CONFIGS / name).read_text()), **overrides}


# (name, checkpoint trained for it, engine config)
METHODS = [
    ("diffusion_self", "nld", {"method": "diffusion_self", "num_speculative_tokens": 7}),
    ("diffusion_self_quadratic", "nld", {"method": "diffusion_self", "mode": "quadratic", "num_speculative_tokens": 3}),
    ("jacobi", "jacobi_forcing", {"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear"}),
    ("jacobi_recycling", "jacobi_forcing", {"method": "jacobi", **preset("tiny-jacobi-forcing.json")}),
    ("wedlm", "wedlm", {"method": "wedlm", **preset("tiny-wedlm.json")}),
    ("diffusion", "nld", {"method": "diffusion", **preset("tiny-nld-diffusion.json")}),
    ("wedlm_spec", "wedlm", {"method": "wedlm_spec", **preset("tiny-wedlm-spec.json")}),
]
# The real model's methods (`--model smollm2`): its presets, with the shipped draft adapter.
REAL_METHODS = [
    ("diffusion_self", "smollm2", {"method": "diffusion_self", **preset("smollm2-self-spec.json")}),
    ("diffusion_self_quadratic", "smollm2", {"method": "diffusion_self", **preset("smollm2-quadratic.json")}),
    ("jacobi", "smollm2", {"method": "jacobi", "block_size": 8, "pool_size": 4, "recycling": "linear"}),
]
# Methods one engine lacks: SGLang has no ngram here, vLLM's verifier takes no recycled branches.
ONE_ENGINE = {"ngram": "vllm", "jacobi_recycling": "sglang"}
SYNC_AR = "ar-sync"  # vLLM's AR without async scheduling (`--sync-ar`)
PROMPTS = [
    "def wrap(text, width=70):", "import heapq", "class Formatter:", "    def __init__(self, ",
    "def bisect_left(a, x, lo=0, hi=None):", "for line in lines:", "    return ''.join(", "if __name__ == '__main__':",
]


def typed(spec: dict) -> Any:
    """An engine config's typed `common/` config."""
    from parallel_decoding.common.methods import parse_config

    return parse_config(spec["method"], {k: v for k, v in spec.items() if k != "method"})


def width(spec: dict) -> int:
    """Tokens a method proposes per step: the width its ngram peer gets (`common.methods`)."""
    from parallel_decoding.common.methods import max_proposals

    return max_proposals(spec["method"], typed(spec))


def adapts(spec: dict) -> bool:
    """Whether the method chooses its widths by load (`common.width_planner`): then it also runs pinned to its
    configured width (`-fixed`)."""
    return getattr(typed(spec), "adapts", False)


def ngram(spec: dict) -> dict:
    return {"method": "ngram", "num_speculative_tokens": width(spec), "prompt_lookup_max": 3}


def histogram(num_drafts: int, accepted_per_position: list[int]) -> list[int]:
    """Verify steps by number of accepted drafts, from per-position acceptance counts."""
    reached = [num_drafts, *accepted_per_position, 0]
    return [reached[k] - reached[k + 1] for k in range(len(reached) - 1)]


class VllmRun:
    """One vLLM engine of a bench run (its core in a process of its own, vLLM's default), built and warmed up with
    one batch, then timed a batch of `batch_size` prompts at a time (`round`); `finish` is its record."""

    def __init__(self, model: str, spec: dict | None, batch_size: int, max_tokens: int, rounds: int,
                 prompts: list[str], dtype: str = "float32", max_model_len: int = 512,
                 async_scheduling: bool | None = None) -> None:
        from vllm import LLM, SamplingParams

        from parallel_decoding.vllm_plugin.metrics import acceptance

        self.spec = spec
        self.llm = LLM(model=model, speculative_config=spec, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
                       dtype=dtype, max_model_len=max_model_len, max_num_seqs=batch_size, disable_log_stats=False,
                       seed=0, worker_extension_cls="parallel_decoding.vllm_plugin.probe.StateProbe",
                       async_scheduling=async_scheduling)
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        self.batches = [[prompts[(r * batch_size + i) % len(prompts)] for i in range(batch_size)]
                        for r in range(rounds)]
        self.llm.generate(self.batches[0], self.params, use_tqdm=False)
        self.before = acceptance(self.llm) if spec else None
        self.tokens, self.seconds, self.timed = 0, 0.0, 0

    def round(self) -> float:
        """Generate the next batch; its tokens per second."""
        batch = self.batches[self.timed % len(self.batches)]
        start = time.perf_counter()
        tokens = sum(len(o.outputs[0].token_ids) for o in self.llm.generate(batch, self.params, use_tqdm=False))
        seconds = time.perf_counter() - start
        self.tokens, self.seconds, self.timed = self.tokens + tokens, self.seconds + seconds, self.timed + 1
        return tokens / seconds

    def finish(self) -> dict:
        """The record of the batches timed so far; the engine is gone after it."""
        from parallel_decoding.vllm_plugin.metrics import acceptance, planner

        drafts = accepted = 0
        counts = None
        if self.spec:
            after, before = acceptance(self.llm), self.before
            drafts = after.num_drafts - before.num_drafts
            accepted = after.num_accepted_tokens - before.num_accepted_tokens
            per_position = [a - b for a, b in zip(after.accepted_per_position, before.accepted_per_position + [0] * (
                len(after.accepted_per_position) - len(before.accepted_per_position)), strict=True)]
            counts = histogram(drafts, per_position)
        widths = planner(self.llm) if self.spec else None
        pipelined = bool(self.llm.llm_engine.vllm_config.scheduler_config.async_scheduling)
        del self.llm
        tokens = self.tokens
        return {
            "tokens_per_second": tokens / self.seconds,
            "tokens_per_forward": tokens / (tokens - accepted) if accepted < tokens else None,
            "p_cache": None if self.spec else 1.0,
            "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "acceptance_histogram": counts,
            "tokens": tokens,
            "seconds": self.seconds,
            "planner": widths,
            "async_scheduling": pipelined,
        }


class SglangRun:
    """As `VllmRun`, on an offline `sglang.Engine` selecting the method with `decode_mode` / `decode_config`."""

    def __init__(self, model: str, spec: dict | None, batch_size: int, max_tokens: int, rounds: int,
                 prompts: list[str], dtype: str = "float32", max_model_len: int = 512) -> None:
        import os

        import torch

        from scripts.sglang_server import CPU_KWARGS, cpu_env

        if not torch.cuda.is_available():
            os.environ.update(cpu_env())
        import sglang

        # On CPU every engine of the run gets the same KV pool, room for the batch at full length: SGLang sizes it
        # from the memory left free, which the engines started before it take (SmolLM2 in float32: the last of four
        # engines at batch 32 held half the batch, the last of six at batch 1 none).
        kwargs = {"context_length": max_model_len} | ({} if torch.cuda.is_available() else {
            **CPU_KWARGS, "dtype": dtype, "mem_fraction_static": 0.6, "max_total_tokens": batch_size * max_model_len})
        if spec is not None:
            kwargs.update(decode_mode=spec["method"], decode_config={k: v for k, v in spec.items() if k != "method"})
        self.spec = spec
        self.engine = sglang.Engine(model_path=model, max_running_requests=batch_size, random_seed=0, **kwargs)
        self.params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
        self.batches = [[prompts[(r * batch_size + i) % len(prompts)] for i in range(batch_size)]
                        for r in range(rounds)]
        self.outputs: list[dict] = []
        self.seconds, self.timed = 0.0, 0
        try:
            self.engine.generate(self.batches[0], self.params)
        except BaseException:
            self.engine.shutdown()
            raise

    def round(self) -> float:
        """Generate the next batch; its tokens per second."""
        batch = self.batches[self.timed % len(self.batches)]
        start = time.perf_counter()
        outputs = self.engine.generate(batch, self.params)
        seconds = time.perf_counter() - start
        self.outputs, self.seconds, self.timed = self.outputs + outputs, self.seconds + seconds, self.timed + 1
        return sum(out["meta_info"]["completion_tokens"] for out in outputs) / seconds

    def finish(self) -> dict:
        """The record of the batches timed so far; the engine is shut down."""
        try:
            widths = self.engine.get_server_info()["internal_states"][0].get("parallel_decoding_width_planner")
        finally:
            self.engine.shutdown()
        tokens = sum(out["meta_info"]["completion_tokens"] for out in self.outputs)
        steps = sum(out["meta_info"].get("spec_verify_ct") or 0 for out in self.outputs)
        return {
            "tokens_per_second": tokens / self.seconds,
            "tokens_per_forward": None if self.spec else 1.0,
            "p_cache": None if self.spec else 1.0,
            "acceptance_length": (tokens - len(self.outputs)) / steps if steps else 1.0,
            "acceptance_histogram": None,
            "tokens": tokens,
            "seconds": self.seconds,
            "planner": widths,
        }


class ReferenceRequests:
    """One method (AR where `spec` is None) in `common/`'s reference runner on a checkpoint, timed a request at a
    time (greedy, the config's draft adapter), its counts summed over the requests counted."""

    def __init__(self, model_dir: str, spec: dict | None, max_tokens: int, dtype: str = "float32",
                 device: str = "cpu") -> None:
        import torch

        from parallel_decoding.common.reference_setup import reference_setup

        method, settings = (spec["method"], {k: v for k, v in spec.items() if k != "method"}) if spec else ("ar", {})
        self.setup = reference_setup(model_dir, method, settings, device=device, dtype=getattr(torch, dtype))
        self.limits = self.setup.limits(max_tokens, stop_at_eos=False)
        self.tokens = self.forwards = self.generated = self.rows = 0
        self.seconds = 0.0
        self.rounds: list[float] = []  # each counted request's tokens per second

    def run(self, prompt: str, counted: bool = True) -> None:
        from parallel_decoding.common.sampling import SamplingParams

        decoder = self.setup.decoder(self.setup.tokenizer.encode(prompt), SamplingParams(), self.limits)
        result = self.setup.runner.run(decoder)
        if counted:
            self.tokens, self.forwards = self.tokens + len(decoder.output), self.forwards + decoder.forwards
            self.generated += len(decoder.output) - decoder.prefill_tokens
            self.rows += decoder.decode_rows
            self.seconds += result.seconds
            self.rounds.append(len(decoder.output) / result.seconds)

    def record(self) -> dict:
        """Tokens per forward, p_cache, tokens, seconds, each request's tokens per second and the planner's record."""
        planner = self.setup.runner.planner
        return {"tokens_per_forward": self.tokens / self.forwards, "p_cache": self.generated / max(self.rows, 1),
                "tokens": self.tokens, "seconds": self.seconds, "rounds_tokens_per_second": self.rounds,
                "planner": None if planner is None else planner.describe()}


def reference_run(model_dir: str, spec: dict | None, max_tokens: int, prompts: list[str], dtype: str = "float32",
                  device: str = "cpu", warm_up: bool = False) -> dict:
    """`prompts` one at a time in `common/`'s reference runner, after the first as a warm-up where asked:
    `ReferenceRequests.record`."""
    requests = ReferenceRequests(model_dir, spec, max_tokens, dtype, device)
    for index, prompt in enumerate(prompts):
        requests.run(prompt, counted=not (warm_up and index == 0))
    return requests.record()


def run_reference(model: str, specs: dict[str, dict | None], batch_size: int, max_tokens: int, rounds: int,
                  prompts: list[str], dtype: str = "float32", device: str = "cpu") -> dict[str, dict]:
    """`--engine reference`: the methods `specs` (by name) on one checkpoint, each in a runner of its own, one
    request at a time in turn: a warm-up request each, then `rounds` prompts, round r starting from the r-th
    method (this machine's pace drifts by more than what is measured), each request's speed kept
    (`rounds_tokens_per_second`, set beside AR's round by round)."""
    if batch_size != 1:
        raise SystemExit("--engine reference runs one request at a time: give --batch-sizes 1")
    runners = {name: ReferenceRequests(model, spec, max_tokens, dtype, device) for name, spec in specs.items()}
    names = list(runners)
    for name in names:
        runners[name].run(prompts[0], counted=False)
    for r in range(rounds):
        for i in range(len(names)):
            runners[names[(r + i) % len(names)]].run(prompts[(r + 1) % len(prompts)])
    results = {}
    for name, requests in runners.items():
        run = requests.record()
        results[name] = {**run, "tokens_per_second": run["tokens"] / run["seconds"], "acceptance_length": None,
                         "acceptance_histogram": None}
    return results


def reference_costs(model_dir: str, spec: dict, max_tokens: int, prompts: list[str]) -> dict:
    """Tokens per forward and p_cache of one of our methods, from `common/`'s reference runner (greedy, with the
    config's draft adapter): what the engine runs reproduce token for token."""
    run = reference_run(model_dir, spec, max_tokens, prompts)
    return {"tokens_per_forward": run["tokens_per_forward"], "p_cache": run["p_cache"]}


def summarise(engine: str, runs: dict[tuple, list[dict]], specs: dict[tuple, dict | None]) -> list[dict]:
    """One record per (batch size, checkpoint, method) from its runs `runs[key]` (one per repeat; AR's is the
    baseline): the run whose speedup over the AR run of the same repeat is the median (`speedups`: every repeat's).
    A run timed a batch at a time beside its AR run (`rounds_tokens_per_second`, vLLM's `alternating` engines) is
    set beside it round by round: its speedup is the median of its rounds' ratios. A method also run pinned to its
    configured width (`NAME-fixed`) is set beside that run of the same repeat the same way: `over_fixed`, the median
    over the repeats (`over_fixed_runs`: each repeat's), compares them in the same batches at the same moments
    instead of through two runs' AR."""
    def speedup(run: dict, ar: dict) -> float:
        rounds, ar_rounds = run.get("rounds_tokens_per_second"), ar.get("rounds_tokens_per_second")
        if rounds and ar_rounds and len(rounds) == len(ar_rounds):
            return statistics.median(r / a for r, a in zip(rounds, ar_rounds, strict=True))
        return run["tokens_per_second"] / ar["tokens_per_second"]

    records = []
    for key, results in runs.items():
        size, checkpoint, name = key
        baseline = runs[(size, checkpoint, "ar")]
        speedups = [speedup(r, a) for r, a in zip(results, baseline, strict=True)]
        median = sorted(range(len(results)), key=speedups.__getitem__)[len(results) // 2]
        result, chosen = results[median], speedups[median]
        records.append({"engine": engine, "checkpoint": checkpoint, "method": name, "config": specs[key],
                        "batch_size": size, **result, "speedup": chosen, "speedups": speedups,
                        "conversion": chosen / result["tokens_per_forward"] if result["tokens_per_forward"] else None})
        if (pinned := runs.get((size, checkpoint, f"{name}-fixed"))) is not None:
            over = [speedup(r, p) for r, p in zip(results, pinned, strict=True)]
            records[-1].update(over_fixed=statistics.median(over), over_fixed_runs=over)
    return records


def label(record: dict) -> str:
    return f"{record['method']}@{record['checkpoint']}"


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(label(r) for r in records))
    sizes = sorted({r["batch_size"] for r in records})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, key in zip(axes, ("speedup", "tokens_per_forward", "conversion"), strict=True):
        bar = 0.8 / len(sizes)
        for j, size in enumerate(sizes):
            values = [next((r[key] or 0 for r in records if label(r) == m and r["batch_size"] == size), 0)
                      for m in labels]
            ax.bar([i + j * bar for i in range(len(labels))], values, bar, label=f"batch {size}")
        ax.set_xticks([i + bar * (len(sizes) - 1) / 2 for i in range(len(labels))], labels, rotation=45, ha="right",
                      fontsize=7)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(key.replace("_", " "))
        ax.legend(fontsize=7)
    fig.suptitle(f"{records[0]['engine']}, {records[0]['checkpoint']} (speedup over AR on the same checkpoint)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def huginn(args: argparse.Namespace) -> None:
    """`--model huginn`: Huginn's samplers on the Raven of `--models` in the engine; JSON, table and plot."""
    from scripts import bench_huginn

    if args.engine == "reference":
        raise SystemExit("--model huginn runs in vllm or sglang (the reference runner's: scripts.evaluate "
                         "--suite huginn)")
    records = bench_huginn.bench(args.engine, str(copy(Path(args.models))["raven"]),
                                 [int(s) for s in args.batch_sizes.split(",")], args.max_tokens, args.rounds,
                                 args.num_steps, args.max_diffusion_steps)
    Path(args.json).write_text(json.dumps(records, indent=1))
    bench_huginn.show(records)
    if args.png:
        bench_huginn.plot(records, args.png)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "sglang", "reference"], required=True)
    parser.add_argument("--models", default="out/trained-models", help="the trained checkpoints (copied if missing)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--png", default=None, help="bar charts of speedup, tokens per forward and conversion "
                        "(--model huginn: speedup and core passes per token against the batch size)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="timed batches per method and batch size")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--methods", default=",".join(name for name, _, _ in METHODS),
                        help="comma-separated subset; AR on each checkpoint (the baseline) and ngram always run")
    parser.add_argument("--device", default=None, help="--engine reference: cuda or cpu (default: cuda if present)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of the whole plan, one after the other (AR and each method alternate); each "
                             "record gives the median run's speedup over the AR of its own run")
    parser.add_argument("--quick", action="store_true", help="batch 1, 16 tokens, one timed round")
    parser.add_argument("--against-ar", action="store_true",
                        help="each method against AR only: no pinned width (NAME-fixed), no ngram")
    parser.add_argument("--sync-ar", action="store_true",
                        help="vLLM: also AR without async scheduling (ar-sync), as every plugin method runs")
    parser.add_argument("--model", choices=("tiny", "smollm2", "huginn"), default="tiny",
                        help="the tiny trained checkpoints, the real model SmolLM2-135M-Instruct, or Huginn's samplers "
                             "on the trained Raven (--methods does not apply)")
    parser.add_argument("--num-steps", type=int, default=32, help="--model huginn: the recurrences r per token")
    parser.add_argument("--max-diffusion-steps", type=int, default=None,
                        help="--model huginn: the wavefront's steps a request at most (default: its config's)")
    args = parser.parse_args()
    if args.quick:
        args.batch_sizes, args.max_tokens, args.rounds = "1", 16, 1
    if args.model == "huginn":
        huginn(args)
        return
    if args.engine == "reference":  # vLLM's and SGLang's engines alternate (below)
        import torch

        run = functools.partial(run_reference, device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.model == "smollm2":
        from scripts import chat_prompts, smollm2

        paths, methods, dtype = {"smollm2": smollm2.ensure()}, REAL_METHODS, "bfloat16"
        prompts = chat_prompts.texts(paths["smollm2"])
    else:
        paths, methods, prompts, dtype = copy(Path(args.models)), METHODS, PROMPTS, "float32"
    chosen = [(name, checkpoint, spec) for name, checkpoint, spec in methods
              if name in args.methods.split(",") and ONE_ENGINE.get(name, args.engine) == args.engine]
    plan = []
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        for checkpoint in dict.fromkeys(c for _, c, _ in chosen):
            plan.append((size, checkpoint, "ar", None))
            if args.sync_ar and args.engine == "vllm":
                plan.append((size, checkpoint, SYNC_AR, None))
            for name, _, spec in (m for m in chosen if m[1] == checkpoint):
                if args.engine == "reference" and adapts(spec):  # the reference adapts only when asked
                    spec = {**spec, "adaptive": True}
                plan.append((size, checkpoint, name, spec))
                if adapts(spec) and not args.against_ar:
                    plan.append((size, checkpoint, f"{name}-fixed", {**spec, "adaptive": False}))
                if ONE_ENGINE["ngram"] == args.engine and not args.against_ar:
                    plan.append((size, checkpoint, f"ngram-{width(spec)}", ngram(spec)))
    runs: dict[tuple, list[dict]] = {}
    specs, costs = {}, {}
    dtype_here = "float32" if args.engine == "sglang" else dtype
    max_model_len = 1024 if args.model == "smollm2" else 512
    # The engines of a batch size and checkpoint are up at once, their batches timed in turn (`alternating`); the
    # reference runners of a checkpoint are loaded at once and time a request each in turn (`run_reference`).
    serving = {"vllm": VllmRun, "sglang": SglangRun}.get(args.engine)
    groups: dict[tuple, dict[str, dict | None]] = {}
    for repeat, size, checkpoint, name, spec in [(r, *step) for r in range(args.repeats) for step in plan]:
        # the same ngram width for two methods on one checkpoint: once
        groups.setdefault((repeat, size, checkpoint), {})[name] = spec
    unpipelined = functools.partial(VllmRun, async_scheduling=False)  # `SYNC_AR`
    for (_, size, checkpoint), chosen_specs in tqdm(groups.items(), desc=f"{args.engine} bench"):
        model = str(paths[checkpoint])
        if serving:
            results = alternate({name: (unpipelined if name == SYNC_AR else serving,
                                        (model, spec, size, args.max_tokens, args.rounds, prompts, dtype_here,
                                         max_model_len)) for name, spec in chosen_specs.items()}, args.rounds)
        else:
            results = run(model, chosen_specs, size, args.max_tokens, args.rounds, prompts, dtype_here)
        for name, spec in chosen_specs.items():
            result = results[name]
            if spec is not None and spec["method"] != "ngram" and args.engine != "reference":
                # The reference's costs (at the configured width) depend on neither the batch size nor the planner.
                cost_key = json.dumps([model, {k: v for k, v in spec.items() if k != "adaptive"}])
                if cost_key not in costs:
                    costs[cost_key] = reference_costs(model, spec, args.max_tokens, prompts)
                result.update(costs[cost_key])
            runs.setdefault((size, checkpoint, name), []).append(result)
            specs[(size, checkpoint, name)] = spec
    records = summarise(args.engine, runs, specs)
    Path(args.json).write_text(json.dumps(records, indent=1))
    print(f"{'method':<30}{'batch':>6}{'tok/s':>10}{'tok/fwd':>9}{'p_cache':>9}{'acc len':>9}{'speedup':>9}{'conv':>7}")
    for r in records:
        def fmt(value, spec=".2f"):
            return "-" if value is None else format(value, spec)

        print(f"{label(r):<30}{r['batch_size']:>6}{r['tokens_per_second']:>10.1f}{fmt(r['tokens_per_forward']):>9}"
              f"{fmt(r['p_cache']):>9}{fmt(r['acceptance_length']):>9}{r['speedup']:>9.2f}{fmt(r['conversion']):>7}")
    if args.png:
        plot(records, args.png)


if __name__ == "__main__":
    main()
