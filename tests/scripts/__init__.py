"""The scripts' tests: bench, training, checkpoints, tools."""
