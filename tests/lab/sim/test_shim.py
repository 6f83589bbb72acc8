"""The drop-in `vllm` executable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from wedgewatch.lab.sim.version import SIM_VLLM_VERSION
from wedgewatch.lab.sim.vllm_shim import ShimError, install_shim, main


def test_the_shim_is_an_executable_script_for_this_interpreter(tmp_path: Path) -> None:
    """DIR/vllm starts with this Python's shebang and calls the shim's main()."""
    path = install_shim(tmp_path / "bin")
    text = path.read_text()
    assert text.startswith(f"#!{sys.executable}\n")
    assert "from wedgewatch.lab.sim.vllm_shim import main" in text
    assert os.access(path, os.X_OK)
    assert install_shim(tmp_path / "bin") == path  # re-installing over our own shim is fine


def test_a_foreign_vllm_is_not_replaced_unless_forced(tmp_path: Path) -> None:
    """A real vLLM (anything that is not our shim) is kept unless --force."""
    (tmp_path / "vllm").write_text("#!/bin/sh\necho real vllm\n")
    with pytest.raises(ShimError, match="not a wedgewatch shim"):
        install_shim(tmp_path)
    install_shim(tmp_path, force=True)
    assert "wedgewatch sim vllm shim" in (tmp_path / "vllm").read_text()


def test_a_file_in_the_way_of_the_directory_is_an_error(tmp_path: Path) -> None:
    """DIR must be a directory."""
    (tmp_path / "f").write_text("")
    with pytest.raises(ShimError, match="not a directory"):
        install_shim(tmp_path / "f")


def test_version_and_unsupported_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    """`vllm --version` prints the sim's version; other subcommands are refused clearly."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == SIM_VLLM_VERSION
    with pytest.raises(SystemExit) as refused:
        main(["bench", "serve"])
    assert refused.value.code == 2
    assert "only runs `vllm serve`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as helped:
        main(["serve", "--help"])
    assert helped.value.code == 0
    assert "--scheduler-fix" in capsys.readouterr().out


def test_the_simulator_reports_the_release_it_emulates() -> None:
    """Each scheduler structure reports its release, marked as the simulator; the shim's
    `vllm --version` is the default structure's."""
    from wedgewatch.lab.sim.version import sim_vllm_version

    assert sim_vllm_version("0.30") == SIM_VLLM_VERSION == "0.30.0+wedgewatch.sim"
    assert sim_vllm_version("0.31+") == "0.33.0+wedgewatch.sim"
    with pytest.raises(ValueError, match=r"unknown scheduler structure '0\.29'"):
        sim_vllm_version("0.29")
