"""An engine for `scripts.alternating` tests: each round appends its name to a shared file, at a fixed rate."""

from pathlib import Path


class FakeEngine:
    def __init__(self, name: str, log: str, rate: float) -> None:
        self.name, self.log, self.rate, self.rounds = name, Path(log), rate, 0

    def round(self) -> float:
        with self.log.open("a") as log:
            log.write(self.name + "\n")
        self.rounds += 1
        return self.rate

    def finish(self) -> dict:
        if self.name == "broken":
            raise ValueError("broken engine")
        return {"name": self.name, "rounds": self.rounds}
