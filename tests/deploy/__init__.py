"""Tests of the deploy artefacts (Kubernetes, Prometheus, Grafana) with the real tools."""
