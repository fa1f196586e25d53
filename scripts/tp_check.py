"""Every method under vLLM's tensor parallelism gives the greedy tokens it gives on one device.

    python -m scripts.tp_check --json out/tp.json [--tp 2] [--methods jacobi,wedlm]

Each method of `scripts.bench`'s table runs on its trained checkpoint at `tensor_parallel_size` 1 and `--tp`
(vLLM's `mp` executor; on CPU the workers bound one core each with `VLLM_CPU_OMP_THREADS_BIND`), greedy, the
benchmark's prompts, each engine in an interpreter of its own. Writes {method, config, tp, equal, differing} records and
exits non-zero when a method's tokens differ.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from scripts.bench import METHODS, PROMPTS
from scripts.trained_models import copy


def generate(model: str, spec: dict, tp: int, max_tokens: int) -> list[list[int]]:
    """Greedy token ids for the benchmark's prompts, on an engine at tensor parallel size `tp`."""
    if tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tp)))
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, speculative_config=spec, tensor_parallel_size=tp,
              distributed_executor_backend="mp" if tp > 1 else None, enforce_eager=True,
              kv_cache_memory_bytes=64 << 20, dtype="float32", max_model_len=512, seed=0)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                           use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def in_subprocess(model: str, spec: dict, tp: int, max_tokens: int) -> list[list[int]]:
    """`generate` in a fresh interpreter (vLLM's TP workers are its children, which a pool's worker cannot have)."""
    code = ("import json, sys; from scripts.tp_check import generate; "
            "print('TOKENS', json.dumps(generate(*json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([model, spec, tp, max_tokens])], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("TOKENS "))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.tp_check", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/trained-models", help="the trained checkpoints (copied if missing)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--methods", default=",".join(name for name, _, _ in METHODS if name != "jacobi_recycling"))
    args = parser.parse_args()
    copy(Path(args.models))
    runs = [(name, checkpoint, spec) for name, checkpoint, spec in METHODS if name in args.methods.split(",")]
    records = []
    for name, checkpoint, spec in tqdm(runs, desc=f"tp 1 vs {args.tp}"):
        tokens = {}
        for tp in (1, args.tp):
            tokens[tp] = in_subprocess(str(Path(args.models) / checkpoint), spec, tp, args.max_tokens)
        differing = [i for i, (a, b) in enumerate(zip(tokens[1], tokens[args.tp], strict=True)) if a != b]
        records.append({"method": name, "config": spec, "tp": args.tp, "equal": not differing,
                        "differing": differing, "prompts": len(PROMPTS)})
        print(f"{name:>26}: tp {args.tp} {'equals' if not differing else 'DIFFERS from'} tp 1"
              f" ({len(PROMPTS) - len(differing)}/{len(PROMPTS)} prompts)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(records, indent=1))
    sys.exit(0 if all(r["equal"] for r in records) else 1)


if __name__ == "__main__":
    main()
