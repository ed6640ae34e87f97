"""kubernetes_validate with its schema files parsed once per process.

kubernetes_validate.validate re-reads and re-parses the kind's schema and the multi-megabyte
_definitions.json on every call (json decoding was most of the chart tests' CPU). The
schemas are only read, never changed, by the validation, so caching the parsed files gives the
same verdicts. Import `validate` from here instead of from kubernetes_validate."""

from __future__ import annotations

import functools

import kubernetes_validate
from kubernetes_validate import utils

if not hasattr(utils.schema_contents, "cache_info"):
    utils.schema_contents = functools.cache(utils.schema_contents)

validate = kubernetes_validate.validate
ValidationError = kubernetes_validate.ValidationError
SchemaNotFoundError = kubernetes_validate.SchemaNotFoundError
latest_version = kubernetes_validate.latest_version
