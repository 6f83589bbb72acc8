"""The episode: what the daemon does about one target's stall, its events and what survives a
restart.
"""
