"""The lab: the simulator, the real-vLLM harness and the demo. Never imported by the watchdog."""
