"""The version, read by the package metadata (pyproject.toml) and by the code alike.

A constant rather than `importlib.metadata.version()`: that import costs a probe run
(`wedgewatch check`, about 0.12 s of CPU in all) about 30 ms of CPU more (`python -c "import
importlib.metadata"` against `python -c pass`, measured by hand on 2026-12-03).
"""

__version__ = "0.1.0"
