"""Engine arms: the only part of the harness that imports vLLM."""
