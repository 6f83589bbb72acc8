"""Restart and probe: may the server be restarted now, did the restart replace it, is it the
watched server.
"""
