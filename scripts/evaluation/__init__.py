"""The suites of `python -m scripts.evaluate`, one module each: a `run` whose parameters are the flags it reads."""
