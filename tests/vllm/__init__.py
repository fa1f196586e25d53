"""vLLM's tests: the real engine, offline and through its OpenAI server."""
