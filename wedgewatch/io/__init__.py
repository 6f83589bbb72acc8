"""The edge that touches the world: HTTP scrapes, processes, py-spy, files, webhooks, restarts."""
