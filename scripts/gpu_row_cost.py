"""What one forward of a SmolLM2-135M-shaped model costs by its batch and rows, under CUDA graphs.

    python -m scripts.gpu_row_cost --device cuda --json out/row_cost.json
    python -m scripts.gpu_row_cost --device cpu --quick  # smoke test: a tiny subset, eager, no graphs

A check of the width planner's prior (`common.width_planner`: 16 rows cost 1.4x one row; a draft row costs what a
decode row does). The model is a compact plain-torch Llama-shaped decoder with SmolLM2-135M-Instruct's shape (hidden
576, intermediate 1536, 30 layers, 9 attention heads over 3 KV heads of 64, vocab 49152, tied embeddings, RMSNorm,
SiLU MLP, RoPE), random weights in bf16: timing does not depend on the weights. Each request carries R rows (like a
speculative verify step: 1 decode row and R - 1 draft rows) at positions L..L+R-1; the rows attend causally to a
cached prefix of L tokens (`--prefix`) and among themselves, write their keys and values into a static cache, and the
forward ends in logits for every row. Attention is `scaled_dot_product_attention` with an additive mask, the 3 query
heads of each KV head folded into the query length (so no key/value copies), the same kernel for every R.

For each batch B (`--batches`) and rows per request R (`--rows`), and for each B*R requests of 1 row (the same total
rows as decode rows), the forward is captured in a CUDA graph over static buffers and its replays timed with CUDA
events: `--warmup` replays, then the median of `--reps`. A few points are also timed eager (`--eager`). Per (B, R)
the output gives ms per forward, the ratio to (B, 1), what a draft row cost, (t(B, R) - t(B, 1)) / (B (R - 1)),
and what a decode row cost, (t(B R, 1) - t(B, 1)) / (B (R - 1)); and least-squares fits of
t = step + row * rows + draft_row * draft_rows (rows = B R, draft_rows = B (R - 1)) over every point and over the
points of at most `--fit-max-rows` rows.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """SmolLM2-135M-Instruct's shape."""

    hidden: int = 576
    intermediate: int = 1536
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    vocab: int = 49152
    rope_theta: float = 100000.0
    eps: float = 1e-5


class Decoder:
    """A Llama-shaped decoder with fused QKV and gate/up projections (as the serving engines fuse them)."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype, max_pos: int, seed: int = 0) -> None:
        self.s = shape
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def w(*size: int) -> torch.Tensor:
            return (torch.randn(*size, generator=gen) * 0.02).to(device=device, dtype=dtype)

        s = shape
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = w(s.vocab, s.hidden)  # tied: the LM head is its transpose
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(qkv_out, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        self.cos = freqs.cos().to(device=device, dtype=dtype)
        self.sin = freqs.sin().to(device=device, dtype=dtype)


class Step:
    """Static buffers for one (batch, rows) verify step: input ids, positions, KV cache, mask; `forward()` runs it."""

    def __init__(self, model: Decoder, batch: int, rows: int, prefix: int, seed: int = 1) -> None:
        s = model.s
        self.m, self.b, self.r, self.prefix = model, batch, rows, prefix
        dev, dt = model.embed.device, model.embed.dtype
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.ids = torch.randint(0, s.vocab, (batch * rows,), generator=gen).to(dev)
        self.pos = (prefix + torch.arange(rows)).repeat(batch).to(dev)
        kv_len = prefix + rows
        # one cache per layer: [2 (k, v), batch, kv heads, prefix + rows, head dim]; the prefix random, the rows
        # written by each forward
        # (drawn on the device: at B = 2048 the caches hold 12G values)
        torch.manual_seed(seed)
        self.cache = [
            torch.randn(2, batch, s.kv_heads, kv_len, s.head_dim, device=dev, dtype=dt) for _ in range(s.layers)
        ]
        group = s.heads // s.kv_heads
        # row r of a request sees keys 0..prefix + r; the query rows are (group, row) flattened; the mask's storage is
        # padded to a multiple of 16 columns so the memory-efficient kernel takes it without a copy
        cols = torch.arange(kv_len)
        allowed = cols[None, :] <= (prefix + torch.arange(rows))[:, None]
        padded = -(-kv_len // 16) * 16
        mask = torch.full((group * rows, padded), float("-inf"), dtype=torch.float32)
        mask[:, :kv_len] = torch.where(allowed, 0.0, float("-inf")).repeat(group, 1)
        self.mask = mask.to(device=dev, dtype=dt)[:, :kv_len]
        self.logits: torch.Tensor | None = None

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self) -> torch.Tensor:
        m, s, b, r, p = self.m, self.m.s, self.b, self.r, self.prefix
        group, d = s.heads // s.kv_heads, s.head_dim
        q_size, kv_size = s.heads * d, s.kv_heads * d
        cos = m.cos[self.pos][:, None, :]  # [tokens, 1, d / 2]
        sin = m.sin[self.pos][:, None, :]
        h = F.embedding(self.ids, m.embed)  # [tokens, hidden]
        for layer, cache in zip(m.layers, self.cache, strict=True):
            x = F.rms_norm(h, (s.hidden,), layer["ln1"], s.eps)
            q, k, v = F.linear(x, layer["qkv"]).split((q_size, kv_size, kv_size), dim=-1)
            q = self.rope(q.view(-1, s.heads, d), cos, sin)
            k = self.rope(k.view(-1, s.kv_heads, d), cos, sin)
            # write this step's keys and values at positions p..p+r-1
            cache[0, :, :, p:].copy_(k.view(b, r, s.kv_heads, d).transpose(1, 2))
            cache[1, :, :, p:].copy_(v.view(b, r, s.kv_heads, d).transpose(1, 2))
            # query head h reads KV head h // group: fold the group into the query length, rows ordered (group, row)
            qf = q.view(b, r, s.kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, s.kv_heads, group * r, d)
            o = F.scaled_dot_product_attention(qf, cache[0], cache[1], attn_mask=self.mask)
            o = o.view(b, s.kv_heads, group, r, d).permute(0, 3, 1, 2, 4).reshape(b * r, q_size)
            h = h + F.linear(o, layer["o"])
            x = F.rms_norm(h, (s.hidden,), layer["ln2"], s.eps)
            gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer["down"])
        h = F.rms_norm(h, (s.hidden,), m.norm, s.eps)
        return F.linear(h, m.embed)  # logits for every row


def _stats(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    n = len(ordered)
    return {
        "ms": statistics.median(ordered),
        "p10_ms": ordered[int(0.1 * (n - 1))],
        "p90_ms": ordered[math.ceil(0.9 * (n - 1))],
        "min_ms": ordered[0],
    }


def time_cuda(fn: Callable[[], object], warmup: int, reps: int) -> list[float]:
    """Each call timed by CUDA events, no host sync between calls."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]


def time_cpu(fn: Callable[[], object], warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(model: Decoder, batch: int, rows: int, args: argparse.Namespace, graph: bool) -> dict[str, float]:
    step = Step(model, batch, rows, args.prefix)
    if model.embed.device.type != "cuda":
        return _stats(time_cpu(step.forward, args.warmup, args.reps))
    if not graph:
        return _stats(time_cuda(step.forward, args.warmup, args.reps))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step.forward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step.logits = step.forward()
    result = _stats(time_cuda(g.replay, args.warmup, args.reps))
    del g, step
    torch.cuda.empty_cache()
    return result


def attention_kernels(step: Step) -> list[str]:
    """The names of the GPU kernels one eager forward ran that look like attention (never fatal)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step.forward()
            torch.cuda.synchronize()
        names = {e.key for e in prof.key_averages()}
        keys = ("fmha", "attention", "flash", "cudnn", "sdpa", "softmax")
        return sorted(n[:120] for n in names if any(k in n.lower() for k in keys))
    except Exception as exc:  # the profiler is a nicety here
        return [f"profiler failed: {exc!r}"[:200]]


def lstsq(points: list[tuple[float, float, float]]) -> dict[str, float] | None:
    """t = step + row * rows + draft_row * draft_rows over (rows, draft_rows, t); None if underdetermined."""
    if len(points) < 3:
        return None
    a = torch.tensor([[1.0, p[0], p[1]] for p in points], dtype=torch.float64)
    y = torch.tensor([[p[2]] for p in points], dtype=torch.float64)
    if torch.linalg.matrix_rank(a).item() < 3:
        return None
    coef = torch.linalg.lstsq(a, y).solution.flatten().tolist()
    resid = (a @ torch.tensor(coef, dtype=torch.float64)[:, None] - y).abs() / y
    return {
        "step_ms": coef[0],
        "row_ms": coef[1],
        "draft_row_ms": coef[2],
        "points": len(points),
        "max_rel_err": resid.max().item(),
    }


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_points(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        if item:
            b, r = item.lower().split("x")
            out.append((int(b), int(r)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--prefix", type=int, default=512, help="cached tokens per request (L)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--eager", default="1x1,1x16,8x1,8x16,64x1,64x16", help="BxR points also timed without graphs")
    ap.add_argument("--fit-max-rows", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="a tiny subset: batches 1,2, rows 1,2, prefix 32, 3 reps")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.rows, args.prefix, args.warmup, args.reps, args.eager = "1,2", "1,2", 32, 1, 3, "1x2"
    t_start = time.perf_counter()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    graphs = device.type == "cuda"
    batches, rows_list = parse_ints(args.batches), parse_ints(args.rows)
    shape = Shape()
    machine = {
        "device": torch.cuda.get_device_name(device) if graphs else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    print(
        f"# {machine['device']}, torch {machine['torch']}, CUDA {machine['cuda']}, {args.dtype}, prefix {args.prefix}"
    )
    model = Decoder(shape, device, dtype, max_pos=args.prefix + max(rows_list) + 1)

    # the mask: a request's first row reads the same logits whether a draft row follows it or not (fatal on CPU only:
    # on the GPU the two shapes may take kernels that round apart)
    with torch.inference_mode():
        one, two = Step(model, 1, 1, args.prefix), Step(model, 1, 2, args.prefix)
        two.ids[0] = one.ids[0]
        for c1, c2 in zip(one.cache, two.cache, strict=True):
            c2[:, :, :, : args.prefix].copy_(c1[:, :, :, : args.prefix])
        mask_diff = (one.forward()[0].float() - two.forward()[0].float()).abs().max().item()
        kernels = attention_kernels(two) if graphs else []
        del one, two
    print(f"# mask check: first row's logits, 1 row vs 2 rows, max |diff| = {mask_diff:.3g}")
    if kernels:
        print(f"# attention kernels: {kernels}")
    if mask_diff > 0.05 and not graphs:
        print("mask check failed", file=sys.stderr)
        return 1

    needed = sorted({(b, r) for b in batches for r in rows_list} | {(b * r, 1) for b in batches for r in rows_list})
    graph_ms: dict[tuple[int, int], dict[str, float]] = {}
    with torch.inference_mode():
        for b, r in needed:
            graph_ms[(b, r)] = measure(model, b, r, args, graph=graphs)
            st = graph_ms[(b, r)]
            spread = f"p10 {st['p10_ms']:.3f}, p90 {st['p90_ms']:.3f}"
            print(f"  B={b:5d} R={r:3d} rows={b * r:5d}: {st['ms']:.3f} ms ({spread})", flush=True)
        eager_ms: dict[tuple[int, int], dict[str, float]] = {}
        if graphs:
            for b, r in parse_points(args.eager):
                eager_ms[(b, r)] = measure(model, b, r, args, graph=False)

    per_point = []
    for b in batches:
        base = graph_ms[(b, 1)]["ms"]
        for r in rows_list:
            t = graph_ms[(b, r)]["ms"]
            t_dec = graph_ms[(b * r, 1)]["ms"]
            extra = b * (r - 1)
            per_point.append(
                {
                    "batch": b,
                    "rows": r,
                    "total_rows": b * r,
                    "ms": t,
                    "ratio_to_r1": t / base,
                    "ms_same_rows_as_decode": t_dec,
                    "draft_over_decode": t / t_dec,
                    "per_draft_row_ms": (t - base) / extra if extra else None,
                    "per_decode_row_ms": (t_dec - base) / extra if extra else None,
                }
            )
    points = [(float(b * r), float(b * (r - 1)), st["ms"]) for (b, r), st in graph_ms.items()]
    fits = {
        "all": lstsq(points),
        f"rows<={args.fit_max_rows}": lstsq([p for p in points if p[0] <= args.fit_max_rows]),
    }
    decode_curve = {b: st["ms"] for (b, r), st in sorted(graph_ms.items()) if r == 1}

    mode = "graph" if graphs else "eager"
    print(f"\nms per forward ({mode}), ratio to R=1 in brackets")
    print("| B \\ R | " + " | ".join(str(r) for r in rows_list) + " |")
    print("|---" * (len(rows_list) + 1) + "|")
    for b in batches:
        base = graph_ms[(b, 1)]["ms"]
        cells = [f"{graph_ms[(b, r)]['ms']:.3f} ({graph_ms[(b, r)]['ms'] / base:.2f})" for r in rows_list]
        print(f"| {b} | " + " | ".join(cells) + " |")
    print("\nB requests x R rows against B*R requests x 1 row (same rows); per extra row over (B, 1), ms")
    print("| B | R | rows | B x R | B*R x 1 | ratio | per draft row | per decode row |")
    print("|---|---|---|---|---|---|---|---|")
    for p in per_point:
        if p["rows"] == 1:
            continue
        print(
            f"| {p['batch']} | {p['rows']} | {p['total_rows']} | {p['ms']:.3f} | {p['ms_same_rows_as_decode']:.3f} | "
            f"{p['draft_over_decode']:.2f} | {p['per_draft_row_ms']:.4f} | {p['per_decode_row_ms']:.4f} |"
        )
    print("\ndecode only (B x 1): " + ", ".join(f"{b}: {ms:.3f}" for b, ms in decode_curve.items()))
    if eager_ms:
        print("eager: " + ", ".join(f"{b}x{r}: {st['ms']:.3f}" for (b, r), st in eager_ms.items()))
    for name, fit in fits.items():
        if fit:
            print(
                f"fit ({name}, {fit['points']} points): step {fit['step_ms']:.3f} ms + row {fit['row_ms']:.4f} ms"
                f" + draft row {fit['draft_row_ms']:.4f} ms (max rel err {fit['max_rel_err']:.2f})"
            )
    wall = time.perf_counter() - t_start
    print(f"# wall {wall:.1f} s")

    if args.json:
        out = {
            "machine": machine,
            "mask_check_max_abs_diff": mask_diff,
            "attention_kernels": kernels,
            "mode": mode,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "shape": asdict(shape),
            "graph" if graphs else "eager_all": [
                {"batch": b, "rows": r, **st} for (b, r), st in sorted(graph_ms.items())
            ],
            "eager": [{"batch": b, "rows": r, **st} for (b, r), st in eager_ms.items()],
            "per_point": per_point,
            "fits": fits,
            "wall_s": wall,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
