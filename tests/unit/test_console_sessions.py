"""Console sessions sealed in their cookie (quarry.console.sessions): what opens, what never
does (a forged, tampered, foreign, expired or revoked cookie), and the session key's sources.
The same rules over HTTP against real consoles: tests/integration/test_console.py."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from quarry.config import load_settings
from quarry.console import sessions

KEY = b"k" * 40
NOW = 1_000_000.0


def store(key: bytes = KEY, lifetime: float = 3600.0, clock=lambda: NOW) -> sessions.SessionStore:
    return sessions.SessionStore(key, lifetime_seconds=lifetime, clock=clock)


def settings(tmp_path, **overrides):
    return load_settings(env={}, home=str(tmp_path), **overrides)


def test_a_session_opens_in_another_store_with_the_same_key_only():
    made = store().create("alice", "the-token", NOW + 600)
    again = store().get(made.id)  # another process (a restart, a replica): same key
    assert again is not None
    assert (again.user_id, again.token, again.csrf, again.expires_at) == (
        "alice",
        "the-token",
        made.csrf,
        NOW + 600,
    )
    assert store(b"o" * 40).get(made.id) is None  # sealed under another key
    # The browser holds ciphertext only: neither the token nor the CSRF token shows.
    assert "the-token" not in made.id and made.csrf not in made.id


def test_every_session_has_its_own_cookie_serial_and_csrf_token():
    one, two = store().create("alice", "t", NOW + 600), store().create("alice", "t", NOW + 600)
    assert one.id != two.id and one.serial != two.serial and one.csrf != two.csrf


def flip_sealed_byte(cookie: str, index: int) -> str:
    """The cookie with one bit of its sealed bytes flipped. (Changing a base64 character
    instead may only touch the last character's unused bits and leave the bytes as they
    were: a test that then passed or failed by chance.)"""
    version, _, body = cookie.partition(".")
    sealed = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    sealed[index] ^= 0x01
    return f"{version}.{base64.urlsafe_b64encode(bytes(sealed)).decode().rstrip('=')}"


@pytest.mark.parametrize(
    "forge",
    [
        lambda c: "",
        lambda c: "attacker-chosen-session-id",
        lambda c: "s1.",
        lambda c: "s1.!!!not-base64!!!",
        lambda c: "s2" + c[2:],  # another format version
        lambda c: flip_sealed_byte(c, -1),  # the tag changed
        lambda c: flip_sealed_byte(c, 5),  # the nonce changed
        lambda c: flip_sealed_byte(c, 20),  # the ciphertext changed
        lambda c: c[: len(c) // 2],  # cut short
    ],
)
def test_a_forged_or_tampered_cookie_is_no_session(forge):
    made = store().create("alice", "t", NOW + 600)
    assert store().get(forge(made.id)) is None


def test_a_cookie_sealing_another_users_payload_under_a_guessed_key_is_refused():
    """What a forger could make without the key: the right format, any session inside."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    body = b'{"s":"x","u":"admin","t":"t","c":"c","e":9999999999}'
    sealed = nonce + AESGCM(b"\0" * 32).encrypt(nonce, body, b"s1")
    cookie = "s1." + base64.urlsafe_b64encode(sealed).decode().rstrip("=")
    assert store().get(cookie) is None


def test_a_session_never_outlives_its_token_nor_the_session_lifetime():
    now = [NOW]
    clock = store(lifetime=3600, clock=lambda: now[0])
    short_token = clock.create("alice", "t", NOW + 600)
    assert short_token.expires_at == NOW + 600
    long_token = clock.create("alice", "t", NOW + 86_400)
    assert long_token.expires_at == NOW + 3600
    now[0] = NOW + 599
    assert clock.get(short_token.id) is not None
    now[0] = NOW + 600
    assert clock.get(short_token.id) is None
    assert clock.get(long_token.id) is not None
    now[0] = NOW + 3600
    assert clock.get(long_token.id) is None


def test_sign_out_and_a_replacing_sign_in_revoke_the_old_cookie_in_this_process():
    here = store()
    first = here.create("alice", "t", NOW + 600)
    second = here.create("alice", "t", NOW + 600, replaces=first.id)
    assert here.get(first.id) is None and here.get(second.id) is not None
    here.delete(second.id)
    assert here.get(second.id) is None
    # The stated limit: another process that never saw the sign-out still opens a copy.
    assert store().get(second.id) is not None


def test_the_revoked_set_is_bounded_and_forgets_the_soonest_expiring_first(monkeypatch):
    monkeypatch.setattr(sessions, "MAX_REVOKED", 3)
    here = store()
    made = [here.create("u", "t", NOW + 100 + i) for i in range(4)]
    for session in made:
        here.delete(session.id)
    # The one expiring soonest was forgotten to make room; the other three stay revoked.
    assert here.get(made[0].id) is not None
    assert all(here.get(s.id) is None for s in made[1:])


def test_a_session_keeps_its_process_cache_across_requests():
    here = store()
    made = here.create("alice", "t", NOW + 600)
    made.cache["client"] = "built once"
    assert here.get(made.id).cache["client"] == "built once"


def test_check_csrf_refuses_empty_and_wrong_tokens():
    assert sessions.check_csrf("abc", "abc")
    assert not sessions.check_csrf("abc", "abd")
    assert not sessions.check_csrf("", "")
    assert not sessions.check_csrf("abc", "")


def test_the_key_setting_wins_then_the_key_file_and_none_or_short_is_refused(tmp_path):
    assert sessions.session_key(settings(tmp_path, console_session_key="s" * 32)) == b"s" * 32
    with pytest.raises(sessions.ConsoleSessionKeyMissing) as missing:
        sessions.session_key(settings(tmp_path))
    assert missing.value.code.name == "FAILED_PRECONDITION"
    assert "QUARRY_CONSOLE_SESSION_KEY" in str(missing.value)
    (tmp_path / "console-session.key").write_text("short\n")
    with pytest.raises(sessions.ConsoleSessionKeyMissing, match="at least 32"):
        sessions.session_key(settings(tmp_path))


def test_up_creates_the_key_file_once_with_mode_0600(tmp_path):
    sessions.ensure_session_key(settings(tmp_path))
    path = tmp_path / "console-session.key"
    key = sessions.session_key(settings(tmp_path))
    assert len(key) == 64 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    sessions.ensure_session_key(settings(tmp_path))
    assert sessions.session_key(settings(tmp_path)) == key  # never replaced
    elsewhere = tmp_path / "elsewhere"
    sessions.ensure_session_key(settings(elsewhere, console_session_key="s" * 32))
    assert not (elsewhere / "console-session.key").exists()
