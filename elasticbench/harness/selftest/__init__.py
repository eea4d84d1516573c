"""The verifier's own test: deliberately wrong kernels it must catch, correct ones it must pass."""
