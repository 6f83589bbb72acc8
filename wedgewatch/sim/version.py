"""The version string the simulator reports where vLLM reports its own."""

SIM_VLLM_VERSION = "0.33.0+wedgewatch.sim"
"""vLLM 0.33.0's surfaces (metrics families, routes), marked as the simulator."""
