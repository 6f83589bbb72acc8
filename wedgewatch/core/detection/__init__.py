"""Detection: is an engine wedged? The detector, its memory, the words it judges with,
readiness, the canary.
"""
