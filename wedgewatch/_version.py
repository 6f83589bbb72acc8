"""The version, read by the package metadata (pyproject.toml) and by the code alike.

A constant rather than `importlib.metadata.version()`: that import costs a probe run
(`wedgewatch check`) more than a tenth of a second.
"""

__version__ = "0.1.0"
