"""wedgewatch: a watchdog for vLLM servers that wedge while /health stays green."""

from wedgewatch._version import __version__

__all__ = ["__version__"]
