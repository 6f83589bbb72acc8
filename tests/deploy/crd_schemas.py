"""JSON schemas for the prometheus-operator custom resources the manifests use.

kubernetes-validate ships schemas for built-in kinds only. These are written from the
monitoring.coreos.com/v1 CRDs (PodMonitor, PrometheusRule) for the fields used here, with
the CRDs' own patterns and enums, and `additionalProperties: false` everywhere, so a
misspelt or misplaced field fails instead of being silently pruned by the API server.
"""

from __future__ import annotations

from typing import Any

# The CRDs' duration pattern (prometheus-operator's monitoringv1.Duration).
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$"
)
LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
RELABEL_ACTIONS = [
    spelling
    for action in (
        "replace",
        "keep",
        "drop",
        "hashmod",
        "labelmap",
        "labeldrop",
        "labelkeep",
        "lowercase",
        "uppercase",
        "keepequal",
        "dropequal",
    )
    for spelling in (action, action[0].upper() + action[1:])
]
STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

METADATA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

RELABEL_CONFIG: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": RELABEL_ACTIONS},
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
    },
}

POD_MONITOR: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": STRING_MAP,
                        "matchExpressions": {"type": "array", "items": {"type": "object"}},
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": RELABEL_CONFIG},
                            "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG},
                        },
                    },
                },
            },
        },
    },
}

RULE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "for": {"type": "string", "pattern": DURATION},
        "keep_firing_for": {"type": "string", "minLength": 1, "pattern": DURATION},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    # "Only one of `record` and `alert` must be set."
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}

PROMETHEUS_RULE: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {
                                "type": "string",
                                "pattern": r"(?i)^(abort|warn)?$",
                            },
                            "rules": {"type": "array", "items": RULE},
                        },
                    },
                },
            },
        },
    },
}

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}
