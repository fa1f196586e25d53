"""Engines of one benchmark up at once, each in a process of its own, timed a batch at a time in rotated order, so
that this machine's drifts (several percent within minutes) fall on every engine alike instead of on whichever
ran later."""

import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any, Protocol


class Timed(Protocol):
    """An engine set up and warmed up by its constructor: `round()` times its next batch (tokens/s), `finish()` its
    record, after which it is gone."""

    def round(self) -> float: ...

    def finish(self) -> dict: ...


def _serve(conn: Any, make: Callable[..., Timed], args: tuple) -> None:
    """A child's loop: build the engine, then answer "round" and "finish" (an exception goes back as its text)."""
    try:
        engine = make(*args)
        conn.send(("ready", None))
        while conn.recv() == "round":
            conn.send(("ok", engine.round()))
        conn.send(("ok", engine.finish()))
    except EOFError:
        pass  # the parent is gone (it failed elsewhere): so is this engine
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _answer(conn: Any, name: str) -> Any:
    status, value = conn.recv()
    if status == "error":
        raise RuntimeError(f"engine {name} failed:\n{value}")
    return value


def alternate(engines: dict[str, tuple[Callable[..., Timed], tuple]], rounds: int) -> dict[str, dict]:
    """Each engine's record (`Timed.finish`) with `rounds_tokens_per_second`, its batches' rates by round: the
    engines are built one after another and kept up; round r times every engine once, starting from the r-th."""
    context = multiprocessing.get_context("spawn")
    children: dict[str, tuple[Any, Any]] = {}
    try:
        for name, (make, args) in engines.items():
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, make, args), name=f"bench-{name}")
            process.start()
            child.close()
            children[name] = process, parent
            _answer(parent, name)
        names = list(engines)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                children[name][1].send("round")
                rates[name].append(_answer(children[name][1], name))
        records = {}
        for name in names:
            children[name][1].send("finish")
            records[name] = {**_answer(children[name][1], name), "rounds_tokens_per_second": rates[name]}
        return records
    finally:
        for process, conn in children.values():
            conn.close()
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()
