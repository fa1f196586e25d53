"""An OpenAI-compatible server for ASSD on an any-subset AR (XLNet) checkpoint: `/v1/completions` continues a
prompt (and fills up to a `suffix`, as OpenAI's insert mode does) and `/v1/infill` fills the holes of a text.

    parallel-decoding assd-server --model DIR [--config '{"k": 5, "drafter": "self"}'] [--port 8000]

Neither vLLM nor SGLang can run XLNet's two-stream attention (relative positions, a content and a query stream,
every pass over the whole sequence under a permutation mask), so ASSD is served here, standalone, with the same
surface: streaming, stop strings, max_tokens, EOS, per-request temperature / top_p / top_k / seed, usage with the
model calls (`nfe`), Prometheus counters on `/metrics`, and every request option it does not apply refused by name.
Requests run one at a time on the model (ASSD is batch 1, as upstream); the others wait their turn.
"""

import argparse
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from parallel_decoding.common.assd.decoding import AssdConfig, AssdResult, infill, with_holes
from parallel_decoding.common.errors import ConfigError
from parallel_decoding.common.methods import build_config
from parallel_decoding.common.sampling import SamplingParams

APPLIED = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "suffix",
           "user"}
INFILL_APPLIED = APPLIED - {"max_tokens", "stop", "suffix", "stream"} | {"holes"}
# OpenAI options this server leaves at their defaults: any other value is refused by name.
DEFAULTS = {"n": 1, "best_of": 1, "logprobs": None, "echo": False, "presence_penalty": 0, "frequency_penalty": 0,
            "logit_bias": None}
DEFAULT_MAX_TOKENS = 16


@dataclass
class Request:
    """One fill: the token ids with holes, where the completion's holes are, the sampling and the stop rules."""

    ids: list[int]
    start: int
    end: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)


@dataclass
class Counters:
    requests: int = 0
    tokens: int = 0
    nfe: int = 0
    draft_calls: int = 0

    def add(self, result: AssdResult) -> None:
        self.requests += 1
        self.tokens += result.generated
        self.nfe += result.nfe
        self.draft_calls += result.draft_calls

    def prometheus(self) -> str:
        return "".join(f"# TYPE assd_{name}_total counter\nassd_{name}_total {value}\n"
                       for name, value in vars(self).items())


def refuse_unapplied(body: dict[str, Any], applied: set[str], route: str) -> None:
    """Options outside `applied` must be absent or at their OpenAI default; the first that is not is named."""
    for name, value in body.items():
        if name in applied:
            continue
        if name not in DEFAULTS or name in ("max_tokens", "stop", "suffix", "stream"):
            raise ConfigError(f"{name} is not supported on {route}")
        if value is not None and value != DEFAULTS[name] and not (name == "logit_bias" and value == {}):
            raise ConfigError(f"{name}={value!r} is not supported on {route} (only {DEFAULTS[name]!r})")


class AssdService:
    """The model, its tokenizer and the ASSD settings; turns request bodies into fills and runs them in turn."""

    def __init__(self, model_dir: str, config: AssdConfig, device: str = "cpu", max_model_len: int = 1024) -> None:
        from transformers import PreTrainedTokenizerFast, XLNetLMHeadModel

        self.model_name = model_dir
        self.model = XLNetLMHeadModel.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
        self.mask_id = getattr(self.model.config, "mask_token_id", None) or self.tokenizer.mask_token_id
        if self.mask_id is None:
            raise ConfigError("mask_token_id is required: the checkpoint's config and tokenizer name none")
        self.config, self.max_model_len = config, max_model_len
        self.eos_id = self.tokenizer.eos_token_id
        self.counters = Counters()
        self.lock = threading.Lock()

    def sampling(self, body: dict[str, Any]) -> SamplingParams:
        temperature = body.get("temperature")
        return SamplingParams(temperature=1.0 if temperature is None else float(temperature),
                              top_p=float(body.get("top_p") or 1.0), top_k=int(body.get("top_k") or 0),
                              seed=body.get("seed"))

    def completion(self, body: dict[str, Any], prompt: str) -> Request:
        """prompt + max_tokens holes (+ suffix): the completion is what fills the holes."""
        max_tokens = body.get("max_tokens")
        max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        head = self.tokenizer.encode(prompt)
        if self.mask_id in head:
            raise ConfigError("prompt holds the mask token: use /v1/infill to fill holes inside a text")
        tail = self.tokenizer.encode(body.get("suffix") or "")
        ids = head + [self.mask_id] * max_tokens + tail
        self.check_length(ids)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        return Request(ids, len(head), len(head) + max_tokens, self.sampling(body), stop)

    def infilling(self, body: dict[str, Any]) -> Request:
        """A text whose mask tokens are holes, one token each, and the token positions `holes` names."""
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ConfigError("prompt must be a string holding the holes as mask tokens")
        holes = body.get("holes") or []
        if not isinstance(holes, list):
            raise ConfigError(f"holes must be a list of token positions, got {holes!r}")
        ids = with_holes(self.tokenizer.encode(prompt), holes, self.mask_id)
        if self.mask_id not in ids:
            raise ConfigError(f"prompt has no hole: write {self.tokenizer.mask_token!r} where a token goes, or name "
                              f"token positions in holes")
        self.check_length(ids)
        return Request(ids, 0, len(ids), self.sampling(body))

    def check_length(self, ids: list[int]) -> None:
        if len(ids) > self.max_model_len:
            raise ConfigError(f"prompt, holes and suffix take {len(ids)} tokens, over the server's "
                              f"max_model_len {self.max_model_len}")

    def run(self, request: Request, on_step: Callable[[list[int]], None] | None = None) -> AssdResult:
        with self.lock:
            result = infill(self.model, request.ids, self.mask_id, self.config, request.sampling, on_step)
            self.counters.add(result)
        return result

    def text(self, request: Request, ids: list[int], final: bool) -> tuple[str, str | None]:
        """The completion text filled so far (the leading run of filled holes) cut at EOS or a stop string, and the
        finish reason once known. Text that may still become part of a stop string or a multi-byte character is
        held back until the end."""
        filled = ids[request.start : request.end]
        if self.mask_id in filled:
            filled = filled[: filled.index(self.mask_id)]
        reason = "length" if final else None
        if self.eos_id in filled:
            filled, reason = filled[: filled.index(self.eos_id)], "stop"
        text = self.tokenizer.decode(filled)
        hits = [text.index(s) for s in request.stop if s and s in text]
        if hits:
            return text[: min(hits)], "stop"
        if reason is None:
            hold = max((len(s) - 1 for s in request.stop), default=0)
            text = text[: len(text) - hold].rstrip("\ufffd")
        return text, reason


class Handler(BaseHTTPRequestHandler):
    """OpenAI routes over one `AssdService` (set on the server)."""

    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def reply(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str) -> None:
        self.reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def do_GET(self) -> None:
        service = self.server.service  # type: ignore[attr-defined]
        if self.path == "/health":
            self.reply(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                                          "owned_by": "parallel-decoding"}]})
        elif self.path == "/metrics":
            self.reply(200, service.counters.prometheus(), "text/plain; version=0.0.4")
        else:
            self.error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        service: AssdService = self.server.service  # type: ignore[attr-defined]
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise ConfigError("the request body must be a JSON object")
            if self.path == "/v1/completions":
                refuse_unapplied(body, APPLIED, self.path)
                prompts = body.get("prompt")
                prompts = [prompts] if isinstance(prompts, str) else prompts
                if not prompts or not all(isinstance(p, str) for p in prompts):
                    raise ConfigError("prompt must be a string or a list of strings")
                requests = [service.completion(body, p) for p in prompts]
            elif self.path == "/v1/infill":
                refuse_unapplied(body, INFILL_APPLIED, self.path)
                requests = [service.infilling(body)]
            else:
                self.error(404, f"no route {self.path}")
                return
        except (ConfigError, ValueError, TypeError) as err:
            self.error(400, str(err))
            return
        if self.path == "/v1/infill":
            self.infill_reply(service, requests[0])
        elif body.get("stream"):
            self.stream_reply(service, requests)
        else:
            self.completion_reply(service, requests)

    def completion_reply(self, service: AssdService, requests: list[Request]) -> None:
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "nfe": 0, "draft_calls": 0}
        for index, request in enumerate(requests):
            result = service.run(request)
            text, reason = service.text(request, result.token_ids, final=True)
            choices.append({"index": index, "text": text, "finish_reason": reason, "logprobs": None})
            usage["prompt_tokens"] += len(request.ids) - (request.end - request.start)
            usage["completion_tokens"] += len(service.tokenizer.encode(text))
            usage["nfe"] += result.nfe
            usage["draft_calls"] += result.draft_calls
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        self.reply(200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                         "model": service.model_name, "choices": choices, "usage": usage})

    def stream_reply(self, service: AssdService, requests: list[Request]) -> None:
        """Server-sent events: each iteration's newly settled text; a client that goes away ends the fill."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def send(index: int, text: str, reason: str | None) -> None:
            chunk = {"id": ident, "object": "text_completion", "created": created, "model": service.model_name,
                     "choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        try:
            for index, request in enumerate(requests):
                for delta, reason in deltas(service, request):
                    send(index, delta, reason)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            return  # the client left: its fill stopped at the next iteration

    def infill_reply(self, service: AssdService, request: Request) -> None:
        result = service.run(request)
        holes = [i for i, t in enumerate(request.ids) if t == service.mask_id]
        self.reply(200, {
            "id": f"infill-{uuid.uuid4().hex}", "object": "infill", "created": int(time.time()),
            "model": service.model_name, "text": service.tokenizer.decode(result.token_ids),
            "fills": [service.tokenizer.decode([result.token_ids[i]]) for i in holes],
            "usage": {"prompt_tokens": len(request.ids) - len(holes), "completion_tokens": len(holes),
                      "total_tokens": len(request.ids), "nfe": result.nfe, "draft_calls": result.draft_calls},
        })


def deltas(service: AssdService, request: Request) -> Iterator[tuple[str, str | None]]:
    """(new text, finish reason or None) as the fill settles, running the fill in a thread: a consumer that stops
    (its client went away) stops the fill at its next iteration."""
    states: list[list[int] | None] = []
    ready = threading.Condition()
    cancelled = threading.Event()
    outcome: dict[str, Any] = {}

    def on_step(ids: list[int]) -> None:
        if cancelled.is_set():
            raise InterruptedError
        with ready:
            states.append(ids)
            ready.notify()

    def work() -> None:
        try:
            outcome["result"] = service.run(request, on_step)
        except InterruptedError:
            pass
        except Exception as err:  # surfaced to the consumer
            outcome["error"] = err
        finally:
            with ready:
                states.append(None)
                ready.notify()

    threading.Thread(target=work, daemon=True).start()
    sent = ""
    try:
        while True:
            with ready:
                ready.wait_for(lambda: states)
                ids = states.pop(0)
            if ids is None:
                break
            text, reason = service.text(request, ids, final=False)
            if len(text) > len(sent):
                yield text[len(sent) :], None
                sent = text
            if reason is not None:
                break
    finally:
        cancelled.set()
    if "error" in outcome:
        raise outcome["error"]
    final_ids = outcome["result"].token_ids if "result" in outcome else ids
    text, reason = service.text(request, final_ids, final="result" in outcome)
    yield text[len(sent) :] if text.startswith(sent) else "", reason or "stop"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="parallel-decoding assd-server", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an XLNet-style any-subset AR checkpoint directory")
    parser.add_argument("--config", default=None, help='ASSD settings as JSON, e.g. {"k": 5, "drafter": "self"}')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-model-len", type=int, default=1024)
    args = parser.parse_args(argv)
    try:
        config = build_config(AssdConfig, "assd", args.config)
        service = AssdService(args.model, config, args.device, args.max_model_len)
    except ConfigError as err:
        parser.exit(2, f"error: {err}\n")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.service = service  # type: ignore[attr-defined]
    print(f"ASSD server on http://{args.host}:{args.port} ({args.model}, {config})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
