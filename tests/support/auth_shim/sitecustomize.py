"""Test-only, interim (issue 12): in `quarry` child processes of the tests, the clients'
channels carry the fixed test admin's token (tests/support/auth.py), minted with the test
signing key from the environment. Put on PYTHONPATH by support.processes.quarry_env while
QUARRY_TEST_CLIENT_TOKENS=1. To be removed when Client logs in with QUARRY_ACCESS_KEY_ID /
QUARRY_SECRET_ACCESS_KEY itself (the client side of the auth contract).

Only the channels quarry.client and quarry.kv.remote open on an ADDRESS are patched, after
those modules are imported: the services pass their own (service-token) channels as
objects, so their wiring is never touched."""

import os
import sys

if os.environ.get("QUARRY_TEST_CLIENT_TOKENS") == "1":
    import importlib.abc
    import importlib.util

    # Modules whose channels to a service the CLI opens on an address get the token.
    _TARGETS = ("quarry.client.client", "quarry.kv.remote")

    def _patch(module):
        from quarry.auth.tokens import TokenAuthority
        from quarry.runtime import channels

        key = os.environ.get("QUARRY_AUTH_SIGNING_KEY", "")
        if not key:
            return  # a test without a key (e.g. serve must refuse to start): no token
        authority = TokenAuthority(key)
        key_id = os.environ.get("QUARRY_ACCESS_KEY_ID", "")
        token, _ = authority.issue_user_token("admin", access_key_id=key_id)

        def open_channel(target, *, traced=True, token_source=None):
            return channels.open_channel(
                target, traced=traced, token_source=token_source or (lambda: token)
            )

        if hasattr(module, "open_channel"):
            module.open_channel = open_channel
        if hasattr(module, "channel_for"):  # quarry.kv.remote (`quarry doctor` reads KV)

            def channel_for(target):
                if isinstance(target, str):
                    return open_channel(target), True
                return target, False

            module.channel_for = channel_for

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _TARGETS:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return None
            loader = spec.loader
            original = loader.exec_module

            def exec_module(module):
                original(module)
                _patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
