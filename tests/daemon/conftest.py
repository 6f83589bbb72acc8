"""Fixtures shared by the daemon's end-to-end test files: real daemons and real simulators."""

from test_e2e_daemon import daemons, sims

__all__ = ["daemons", "sims"]
