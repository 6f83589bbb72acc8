"""The real-server tier's shared pieces: one real `vllm serve` per module and version.

Starting a real CPU vLLM costs a minute or more, so the tests of a module share one server
(`shaped_server`, module-scoped, one per CPU build) unless they destroy it; each test leaves
it healthy or says it does not (docs/development.md, "The real-server tier").
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import real_vllm

SHAPE_ARGS = ("--max-num-seqs", "2", "--max-num-batched-tokens", "32")
"""Two sequences at a time (a queue waits for capacity) and 32-token steps (long prompts are
prefilled in many chunks): the shapes a healthy server shows under load, on a tiny CPU."""


@pytest.fixture(scope="module", params=real_vllm.SERVE_VERSIONS)
def shaped_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[real_vllm.RealServer]:
    """A healthy real `vllm serve` of each CPU build with SHAPE_ARGS, stopped after the module."""
    version = str(request.param)
    workdir = tmp_path_factory.mktemp(f"vllm-{version}")
    with real_vllm.running(version, workdir, extra_args=SHAPE_ARGS) as server:
        # A fresh CPU vLLM's first forward passes are slow (oneDNN primitives made on first use
        # of each shape): 16 s and 25 s with every counter flat, measured at load averages 10
        # and 25. A batch of the shapes the tests use is served here first, so a test meets a
        # server as warm as one in service.
        with ThreadPoolExecutor(4) as pool:
            for prompt in ([1, 2, 3], [1, 20, 30, 40], list(range(5, 405)), [7] * 40):
                pool.submit(server.complete, prompt, max_tokens=16)
        yield server
