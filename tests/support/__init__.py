"""Helpers the tests share; no test module imports another."""
