"""Evidence and triage: what a bundle holds, what its stacks say, which known issue it
matches, retention.
"""
