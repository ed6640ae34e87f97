"""Test-only, interim (issue 12): in `quarry` child processes of the tests, the clients'
channels carry the fixed test admin's token (tests/support/auth.py), minted with the test
signing key from the environment. Put on PYTHONPATH by support.processes.quarry_env while
QUARRY_TEST_CLIENT_TOKENS=1. To be removed when Client logs in with QUARRY_ACCESS_KEY_ID /
QUARRY_SECRET_ACCESS_KEY itself (the client side of the auth contract).

Only quarry.client's channels are patched, after that module is imported: the services'
own channels (and so their wiring of service tokens) are never touched."""

import os
import sys

if os.environ.get("QUARRY_TEST_CLIENT_TOKENS") == "1":
    import importlib.abc
    import importlib.util

    _TARGET = "quarry.client.client"

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

        module.open_channel = open_channel

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _TARGET:
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
