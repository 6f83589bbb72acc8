"""Pure decisions, no IO: time is passed in, results are data (detector, restart policy, triage)."""
