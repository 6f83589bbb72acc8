"""The real-vLLM harness: vLLM's own code driven on a CPU, a tiny model, a connector, the
seed's wedge.
"""
