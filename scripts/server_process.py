"""Run an OpenAI-compatible server as a child process and hand out a client once it answers (demo and tests)."""

import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai


class ServerClient(openai.OpenAI):
    """An `openai` client of a server this process started, with the server's process (for its memory)."""

    process: subprocess.Popen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(
    name: str, cmd: list[str], port: int, env: dict[str, str], log_path: str | Path | None, timeout: float,
) -> Iterator[ServerClient]:
    """Start `cmd` (listening on `port`), wait until `/v1/models` answers, yield a client; stop the server on exit.

    The server's output goes to `log_path` (a temporary file by default); its tail is in the error if it dies, and
    added to any error raised while the client is in use. The client opens a connection per request: a pooled
    connection the server closes as idle (uvicorn's keep-alive timeout) while a request is being sent on it fails
    as "Server disconnected without sending a response", and the client does not retry (a retry could hide a
    server's error).
    """
    log_path = Path(log_path or tempfile.mkstemp(suffix=".log")[1])
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        client = ServerClient(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300,
                              http_client=httpx.Client(limits=httpx.Limits(max_keepalive_connections=0),
                                                       timeout=300))
        client.process = proc
        try:
            deadline = time.time() + timeout
            while True:
                try:
                    client.models.list()
                    break
                except openai.APIConnectionError:
                    if proc.poll() is not None or time.time() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"{name} server did not start:\n{log.read()[-4000:]}") from None
                    time.sleep(1)
            yield client
        except Exception as error:
            log.seek(0)
            state = "still running" if proc.poll() is None else f"exited with {proc.returncode}"
            error.add_note(f"{name} server ({state}), the tail of its output:\n{log.read()[-4000:]}")
            raise
        finally:
            proc.terminate()
            proc.wait(60)
