"""The long-running watchdog: its loop, its HTTP face (/status, /metrics) and its own metrics."""
