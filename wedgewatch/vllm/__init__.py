"""What wedgewatch knows about vLLM: metrics, progress, process titles, launch profiles."""
