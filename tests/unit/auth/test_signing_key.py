"""The signing key (settings → key, `quarry up`'s key file) and the services' own tokens."""

from __future__ import annotations

import os
import stat

import pytest

from quarry.auth.keys import SigningKeyMissing, ensure_signing_key, resolve_signing_key
from quarry.auth.service_tokens import ServiceTokens, service_auth
from quarry.auth.tokens import TokenAuthority
from quarry.config import load_settings

KEY = "k" * 40


def settings(tmp_path, **overrides):
    return load_settings(env={}, home=str(tmp_path), **overrides)


def test_the_key_setting_wins_then_the_key_file(tmp_path):
    assert resolve_signing_key(settings(tmp_path, auth_signing_key=KEY)) == KEY.encode()
    (tmp_path / "signing.key").write_text("f" * 64 + "\n")
    assert resolve_signing_key(settings(tmp_path)) == b"f" * 64
    other = tmp_path / "other.key"
    other.write_text("o" * 32)
    assert resolve_signing_key(settings(tmp_path, auth_signing_key_file=str(other))) == b"o" * 32


def test_no_key_or_a_short_one_is_refused_with_how_to_fix_it(tmp_path):
    with pytest.raises(SigningKeyMissing) as missing:
        resolve_signing_key(settings(tmp_path))
    assert missing.value.code.name == "FAILED_PRECONDITION"
    assert "QUARRY_AUTH_SIGNING_KEY" in str(missing.value)
    with pytest.raises(SigningKeyMissing, match="at least 32"):
        resolve_signing_key(settings(tmp_path, auth_signing_key="short"))
    # Auth on and no key: a service refuses to be built, never serves without auth.
    with pytest.raises(SigningKeyMissing):
        service_auth(settings(tmp_path), "committer")
    assert service_auth(settings(tmp_path, auth_enabled=False), "committer") is None


def test_up_creates_the_key_file_once_with_mode_0600_and_never_replaces_it(tmp_path):
    key = ensure_signing_key(settings(tmp_path))
    path = tmp_path / "signing.key"
    assert len(key) == 64 and path.read_bytes().strip() == key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_signing_key(settings(tmp_path)) == key  # the same key next time
    path.write_text("an operator's own key, 32 bytes or more")
    assert ensure_signing_key(settings(tmp_path)) == b"an operator's own key, 32 bytes or more"
    # A key in the settings: no file is written.
    elsewhere = tmp_path / "elsewhere"
    ensure_signing_key(settings(elsewhere, auth_signing_key=KEY))
    assert not (elsewhere / "signing.key").exists()


def test_service_tokens_are_reused_then_renewed_before_they_expire():
    now = [1_000_000.0]
    authority = TokenAuthority(KEY, clock=lambda: now[0])
    tokens = ServiceTokens(authority, "committer", lifetime=600, clock=lambda: now[0])
    first = tokens()
    assert tokens() == first
    principal = authority.verify(first)
    assert (principal.kind, principal.id) == ("service", "committer")
    now[0] += 600 - 61  # more than a minute left: still the same token
    assert tokens() == first
    now[0] += 2  # within the last minute: a new one, valid past the old expiry
    renewed = tokens()
    assert renewed != first
    assert authority.verify(renewed).expires_at > principal.expires_at


def test_a_service_without_an_iam_store_refuses_every_user():
    from quarry.auth.authorizer import ServicesOnlyAuthorizer
    from quarry.auth.errors import ServicePrincipalRequired
    from quarry.auth.tokens import Principal

    authorizer = ServicesOnlyAuthorizer()
    for check in (
        lambda p: authorizer.check_principal(p),
        lambda p: authorizer.authorize(p, "fs:ReadObject", ("*",)),
    ):
        with pytest.raises(ServicePrincipalRequired):
            check(Principal("user", "admin"))
        check(Principal("service", "committer"))
