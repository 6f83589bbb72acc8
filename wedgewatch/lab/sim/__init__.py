"""A vLLM stand-in that wedges by the real mechanism (see docs/simulator.md)."""
