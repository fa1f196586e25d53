"""SGLang's tests, run in SGLang's environment (`tests/sglang/conftest.py`)."""
