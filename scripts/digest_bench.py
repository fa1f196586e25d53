"""How long one step's digest of its logit rows takes for a batch of committing decoders: `common.row_stats.apply_rows`
(one reduction over the whole batch, one copy to the host) against each decoder reading its own rows copied to the
host as float32, at several batch sizes and a real vocabulary, on CPU or GPU. No model: the rows are random logits
made on the device before the clock starts, and both paths digest the same rows.

    python -m scripts.digest_bench --vocab 151936 --json out/digest.json      # on the GPU where there is one
"""

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from parallel_decoding.common.decoder import Decoder, Limits
from parallel_decoding.common.methods import make_decoder, parse_config
from parallel_decoding.common.row_stats import apply_rows
from parallel_decoding.common.sampling import SamplingParams

METHODS = {
    "wedlm": {"window": 16, "entropy_threshold": 2.0, "distance_penalty": 0.02},
    "diffusion": {"block_size": 16, "confidence_threshold": 0.2},
    "diffusion_self_quadratic": {"block_size": 8},
    "jacobi": {"block_size": 16, "num_blocks": 2, "pool_size": 4, "verification_size": 4},
}


def decoders(method: str, batch: int, vocab: int) -> list[Decoder]:
    """`batch` greedy decoders past their prefill, which never end within a benchmark."""
    config = parse_config(method, METHODS[method], mask_token_id=vocab - 1)
    made = [make_decoder(method, config, [1] * 16, SamplingParams(), Limits(max_tokens=1 << 20)) for _ in range(batch)]
    for decoder in made:
        decoder.apply(torch.zeros(decoder.next_forward().logit_rows.numel(), vocab))
    return made


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(method: str, batch: int, vocab: int, steps: int, device: torch.device) -> dict:
    """Milliseconds per step of each path, and the rows per step. The per-request path digests the same rows on
    copies of the decoders, taken before the batched path digests them (random rows tie often; the decoders go on
    from the batched path's decisions)."""
    batched = decoders(method, batch, vocab)
    generator = torch.Generator(device=device).manual_seed(0)
    times = {"batched": [], "per_request": []}
    rows = []
    for _ in range(steps):
        sizes = [int(d.next_forward().logit_rows.numel()) for d in batched]
        separate = copy.deepcopy(batched)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.digest_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default: Qwen's)")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cases = [(m, int(b)) for m in args.methods.split(",") for b in args.batch_sizes.split(",")]
    results = [measure(m, b, args.vocab, args.steps, device) for m, b in tqdm(cases, desc="digest")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": name, "vocab": args.vocab, "steps": args.steps, "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    for r in results:
        print(f"{r['method']:>26} batch {r['batch']:>3}: {r['rows_per_step']:6.0f} rows, batched "
              f"{r['batched_ms']:8.2f} ms, per request {r['per_request_ms']:8.2f} ms ({r['speedup']:.2f}x)")


if __name__ == "__main__":
    main()
