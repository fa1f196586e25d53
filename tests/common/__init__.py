"""Engine-free tests: every method's reference decoder and its oracles."""
