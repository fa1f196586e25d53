"""Engine-free parallel decoding: per-request state machines and a transformers reference runner."""
