"""The docs may not say a built feature is missing. Each feature has a probe (the code or
chart file that builds it) and the words the docs name it by; a sentence of README.md or
docs/*.md that says "not built" / "not yet" / "no mTLS" and names a feature whose probe
finds it fails the test. (docs/architecture.md said TLS, mTLS, the chart's secrets and
NetworkPolicy were not built long after they were.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "libs" / "quarry"
CHART = ROOT / "deploy" / "helm" / "quarry" / "templates"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MISSING = re.compile(r"\bnot (?:yet )?built\b|\bnot yet\b|\bno mTLS\b|\bnot carry\b", re.I)


def _has(path: Path, text: str = "") -> bool:
    return path.exists() and text in path.read_text()


# feature: (probe, the words the docs name it by)
FEATURES: dict[str, tuple[Callable[[], bool], tuple[str, ...]]] = {
    "TLS and mTLS": (
        lambda: _has(LIB / "runtime" / "tls.py", "QUARRY_TLS_CLIENT_AUTH"),
        ("TLS", "mTLS"),
    ),
    "the chart's NetworkPolicy": (
        lambda: _has(CHART / "networkpolicies.yaml", "kind: NetworkPolicy"),
        ("NetworkPolicy",),
    ),
    "the chart's Secrets": (
        lambda: (
            _has(CHART / "auth-secret.yaml", "kind: Secret")
            and _has(CHART / "admin-secret.yaml", "kind: Secret")
        ),
        ("Helm secrets", "chart's secrets", "signing key", "credentials"),
    ),
    "a local trace receiver": (
        lambda: _has(LIB / "telemetry" / "receiver.py", "TraceService"),
        ("quarry traces", "trace receiver", "OTLP receiver"),
    ),
    "the CLI's token cache": (
        lambda: _has(LIB / "client" / "token_cache.py", "tokens.json"),
        ("token cache", "tokens.json"),
    ),
    "span worker processes": (
        lambda: _has(LIB / "committed" / "processes.py", "ProcessSpanWorkers"),
        ("span worker process", "QUARRY_RANGE_WRITER_PROCESSES"),
    ),
}


def sentences(text: str) -> list[str]:
    """Prose sentences (code blocks left out), each on one line."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"\n\s*(?:[-*]|#+)\s+", "\n. ", prose)  # list items and headings end one
    flat = " ".join(prose.split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z*`(])|\s*\|\s*", flat)


def claims_missing(text: str) -> list[tuple[str, str]]:
    """(feature, sentence) for each sentence saying a built feature is missing."""
    found = []
    for sentence in sentences(text):
        if not MISSING.search(sentence):
            continue
        for feature, (built, words) in FEATURES.items():
            if any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", sentence) for w in words) and built():
                found.append((feature, sentence))
    return found


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_every_probe_finds_its_feature(feature):
    """A probe that no longer finds what it looks for would let any claim through."""
    assert FEATURES[feature][0](), f"{feature}: the probe finds nothing; update it"


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_the_docs_never_call_a_built_feature_missing(doc):
    assert claims_missing(doc.read_text()) == []


def test_the_old_stale_claims_are_caught():
    stale = (
        "Identity and access is enforced, but servers listen without TLS (no mTLS), and "
        "the Helm chart does not yet carry the signing key, credentials or a NetworkPolicy. "
        "Not built yet: TLS/mTLS, Helm secrets and NetworkPolicy. Not built yet: merge fan-out."
    )
    features = {feature for feature, _ in claims_missing(stale)}
    assert features == {"TLS and mTLS", "the chart's NetworkPolicy", "the chart's Secrets"}
