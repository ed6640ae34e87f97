"""The memory cache sizes reach real `quarry serve` processes from the environment, as a user
sets them (QUARRY_RANGE_CACHE_BYTES, QUARRY_METARANGE_CACHE_BYTES): a valid size serves, a
negative one is refused at start with the setting named, not a traceback."""

from __future__ import annotations

import subprocess

from support.processes import VENV_BIN, free_port, quarry_env, quarry_serve, wait_serving


def test_cache_sizes_from_the_environment(tmp_path):
    port = free_port()
    env = quarry_env(
        tmp_path,
        QUARRY_RANGE_WRITER_PORT=str(port),
        QUARRY_RANGE_CACHE_BYTES="1048576",
        QUARRY_METARANGE_CACHE_BYTES="0",
    )
    with quarry_serve("range-writer", env):
        wait_serving(f"127.0.0.1:{port}", timeout=60)

    refused = subprocess.run(
        [str(VENV_BIN / "quarry"), "serve", "range-writer"],
        env={**env, "QUARRY_RANGE_CACHE_BYTES": "-1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "range_cache_bytes must be 0 or more, not -1" in refused.stderr
    assert "Traceback" not in refused.stderr
