"""The main job: vLLM's OpenAI server on a tiny local model, decoding with diffusion self-speculation.

Trains (or reuses, cached in --models) the NLD-style tiny checkpoint, serves it with
`--speculative-config '{"method": "diffusion_self", "num_speculative_tokens": 8}'`, sends real requests with
the `openai` client (eight at once, then one streamed) and prints the answers, throughput and vLLM's own
speculative-decoding metrics.

    python -m scripts.serve_demo [--models DIR] [--steps 300] [--max-tokens 48]
"""

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.demo import ensure_model
from scripts.vllm_server import metrics, vllm_server

SPEC = {"method": "diffusion_self", "num_speculative_tokens": 8}
PROMPTS = [
    "def wrap(text, width=70):",
    "import heapq\n",
    "class Formatter:",
    "    def __init__(self, ",
    "def bisect_left(a, x, lo=0, hi=None):",
    "for line in lines:",
    "    return ''.join(",
    "if __name__ == '__main__':",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="out/demo-models", help="where the trained tiny checkpoints are cached")
    parser.add_argument("--steps", type=int, default=300, help="training steps for the tiny model")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    model = ensure_model(Path(args.models) / "nld", "nld", args.steps)
    print(f"starting vLLM's OpenAI server on {model} with {SPEC}", flush=True)
    with vllm_server(model, SPEC, log_path=Path(args.models) / "vllm-server.log") as client:

        def complete(prompt: str):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=args.max_tokens, temperature=0)

        start = time.perf_counter()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(complete, PROMPTS))
        seconds = time.perf_counter() - start
        for prompt, answer in zip(PROMPTS, answers, strict=True):
            print(f"\n--- {prompt!r}\n{answer.choices[0].text}")
        tokens = sum(a.usage.completion_tokens for a in answers)
        print(f"\n{len(PROMPTS)} concurrent requests: {tokens} tokens, {seconds:.2f} s, {tokens / seconds:.1f} tok/s")
        print("\nstreamed:", end=" ", flush=True)
        chunks = client.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=args.max_tokens, temperature=0, stream=True
        )
        for chunk in chunks:
            print(chunk.choices[0].text, end="", flush=True)
        samples = metrics(client)
    drafts = sum(v for k, v in samples.items() if k.startswith("vllm:spec_decode_num_drafts_total"))
    accepted = sum(v for k, v in samples.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    per_position = {
        int(k.split('position="')[1].split('"')[0]): v
        for k, v in samples.items()
        if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    }
    print(f"\n\nvLLM metrics: {drafts:.0f} drafts, {accepted:.0f} drafted tokens accepted, "
          f"{1 + accepted / max(drafts, 1):.2f} tokens per verify step (2 forwards each: draft + verify)")
    print("accepted per draft position:", [int(per_position[i]) for i in sorted(per_position)])


if __name__ == "__main__":
    main()
