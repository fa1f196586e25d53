"""Start SGLang's server (`python -m sglang.launch_server`) on a local model and wait until it answers.

On machines without a GPU it runs SGLang's CPU path (`SGLANG_USE_CPU_ENGINE=1`, `--device cpu`) with float32
weights and KV; our plugin supplies the CPU kernel stand-ins and the verify-window attention backend.
"""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts.server_process import ServerClient, free_port, running_server

# SGLang's CPU path, as `sglang.Engine` keyword arguments and as `launch_server` flags. `sleep_on_idle`: an idle
# scheduler otherwise polls its sockets without pause, a whole core (half of a 2-core VM's CPU) taken from whatever
# else runs there, another engine of a bench or a test; sleeping, it wakes on the next request.
CPU_KWARGS = {"device": "cpu", "dtype": "float32", "attention_backend": "torch_native", "sampling_backend": "pytorch",
              "disable_overlap_schedule": True, "mem_fraction_static": 0.05, "sleep_on_idle": True}
CPU_ARGS = [arg for name, value in CPU_KWARGS.items()
            for arg in ["--" + name.replace("_", "-"), *([] if value is True else [str(value)])]]


def launch_command(model: str | Path, decode_mode: str | None, decode_config: str | None, port: int,
                   extra_args: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), *extra_args]
    if decode_mode is not None:
        cmd += ["--decode-mode", decode_mode]
    if decode_config is not None:
        cmd += ["--decode-config", decode_config]
    return cmd


def cpu_env() -> dict[str, str]:
    return {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}


@contextmanager
def sglang_server(
    model: str | Path, decode_mode: str | None = None, decode_config: str | None = None,
    extra_args: list[str] = CPU_ARGS, log_path: str | Path | None = None, timeout: float = 400,
) -> Iterator[ServerClient]:
    """An `openai` client of a running server (served as "tiny"); the server stops on exit."""
    port = free_port()
    cmd = launch_command(model, decode_mode, decode_config, port, extra_args)
    with running_server("SGLang", cmd, port, cpu_env(), log_path, timeout) as client:
        yield client
