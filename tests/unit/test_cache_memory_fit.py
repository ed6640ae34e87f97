"""The memory caches fitted to a container's memory limit (Settings.caches_fitted): a pod
whose worker processes' caches would outgrow its `resources.limits.memory` shrinks them
rather than being OOM-killed once they fill. What it must never do: leave caches that do
not fit a limit it read, or shrink caches when there is no limit."""

from __future__ import annotations

import pytest

from quarry import config
from quarry.config import (
    CACHE_RESIDENT_FACTOR,
    MEMORY_LIMIT_SHARE,
    MIN_FITTED_CACHE_BYTES,
    RESIDENT_BASE_BYTES,
    container_memory_limit,
    load_settings,
    processes_that_fit,
)

MIB = 1024 * 1024
GIB = 1024 * MIB


def resident(settings, processes: int) -> float:
    """The resident memory `processes` processes settle at (the measured model)."""
    charged = settings.range_cache_bytes + settings.metarange_cache_bytes
    return processes * (CACHE_RESIDENT_FACTOR * charged + RESIDENT_BASE_BYTES)


def test_caches_that_fit_are_left_as_they_are():
    defaults = load_settings({})
    fitted, reason = defaults.caches_fitted(4 * GIB, 2)
    assert fitted is defaults and reason == ""
    # No limit (a laptop, an unlimited cgroup): never shrunk.
    fitted, reason = defaults.caches_fitted(None, 64)
    assert fitted is defaults and reason == ""


def test_caches_that_do_not_fit_shrink_in_proportion_into_the_limit():
    """The chart's branch-manager: 1 GiB, a worker per core (two here, more on a bigger node)."""
    defaults = load_settings({})
    assert resident(defaults, 2) > GIB  # the defaults alone would be OOM-killed once full
    for processes in (1, 2, 3):
        fitted, reason = defaults.caches_fitted(GIB, processes)
        assert resident(fitted, processes) <= MEMORY_LIMIT_SHARE * GIB
        # Even one process (2 × 320 MiB + 150 MiB) overshoots three quarters of 1 GiB.
        assert fitted.range_cache_bytes < defaults.range_cache_bytes
        # In proportion: the range cache stays four times the metarange cache.
        ratio = fitted.range_cache_bytes / max(1, fitted.metarange_cache_bytes)
        assert abs(ratio - 4) < 0.01 or fitted.range_cache_bytes == 0
        assert "QUARRY_RANGE_CACHE_BYTES 256 MiB" in reason and "1024 MiB" in reason
        assert f"{processes} process(es)" in reason
    # Two workers in 1 GiB still get useful caches (not disabled).
    two, _ = defaults.caches_fitted(GIB, 2)
    assert two.range_cache_bytes > 64 * MIB


def test_a_limit_too_small_for_the_processes_turns_the_caches_off():
    defaults = load_settings({})
    fitted, reason = defaults.caches_fitted(256 * MIB, 4)
    assert fitted.range_cache_bytes == fitted.metarange_cache_bytes == 0
    assert "using 0 MiB + 0 MiB" in reason
    # Four processes need ~600 MiB without caches: the warning says the count is the problem.
    assert "4 processes alone need about 600 MiB" in reason
    _, roomy = defaults.caches_fitted(GIB, 4)
    assert "alone need" not in roomy


@pytest.mark.parametrize("cores", [2, 8, 64])
def test_one_worker_per_core_is_bounded_by_the_memory_limit(monkeypatch, cores):
    """`workers: 0` on a large node without a CPU limit: never more processes than the pod's
    memory holds with the base memory and minimal caches each (the chart's 1 GiB
    branch-manager on a 64-core node would otherwise start 64 and be OOM-killed)."""
    monkeypatch.setattr(config, "usable_cores", lambda: cores)
    auto = load_settings({"QUARRY_BRANCH_MANAGER_WORKERS": "0", "QUARRY_S3_GATEWAY_WORKERS": "0"})
    monkeypatch.setattr(config, "container_memory_limit", lambda: GIB)
    workers = auto.workers_of("branch-manager")
    per_process = RESIDENT_BASE_BYTES + CACHE_RESIDENT_FACTOR * MIN_FITTED_CACHE_BYTES
    assert 1 <= workers <= cores and workers * per_process <= MEMORY_LIMIT_SHARE * GIB
    fitted, _ = auto.caches_fitted(GIB, workers)
    charged = fitted.range_cache_bytes + fitted.metarange_cache_bytes
    assert charged >= MIN_FITTED_CACHE_BYTES - 1  # each keeps useful caches
    assert workers == min(cores, 3)  # 768 MiB / (150 + 64) MiB
    # A service without caches needs the base memory only.
    assert auto.workers_of("s3-gateway") == min(cores, 5)  # 768 / 150
    # A count given explicitly is kept (and warned about by caches_fitted when too many).
    explicit = load_settings({"QUARRY_BRANCH_MANAGER_WORKERS": "16"})
    assert explicit.workers_of("branch-manager") == 16
    # No limit: one per core.
    monkeypatch.setattr(config, "container_memory_limit", lambda: None)
    assert auto.workers_of("branch-manager") == cores


def test_processes_that_fit_is_at_least_one():
    assert processes_that_fit("branch-manager", 64 * MIB) == 1
    assert processes_that_fit("branch-manager", None) >= 1 << 20


def test_caches_turned_off_stay_off_and_need_no_fitting():
    off = load_settings({"QUARRY_RANGE_CACHE_BYTES": "0", "QUARRY_METARANGE_CACHE_BYTES": "0"})
    fitted, reason = off.caches_fitted(64 * MIB, 8)
    assert fitted is off and reason == ""


def test_only_the_services_that_keep_caches_count_processes():
    settings = load_settings(
        {
            "QUARRY_BRANCH_MANAGER_WORKERS": "3",
            "QUARRY_COMMITTER_WORKERS": "2",
            "QUARRY_RANGE_WRITER_PROCESSES": "4",
        }
    )
    assert settings.cache_processes_of("branch-manager") == 3
    assert settings.cache_processes_of("committer") == 2
    assert settings.cache_processes_of("range-writer") == 5  # itself and its span workers
    for service in ("kv-gateway", "compactor-sensor", "s3-gateway", "console", "quarry"):
        assert settings.cache_processes_of(service) == 0
        assert settings.caches_fitted(64 * MIB, 0)[0] is settings


def test_the_limit_is_read_from_cgroup_v2_then_v1(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    files = (str(v2), str(v1))
    assert container_memory_limit(files) is None  # neither file: no limit known
    v1.write_text("536870912\n")
    assert container_memory_limit(files) == 512 * MIB
    v1.write_text("9223372036854771712\n")  # cgroup v1's "unlimited"
    assert container_memory_limit(files) is None
    v2.write_text("max\n")
    assert container_memory_limit(files) is None
    v2.write_text("1073741824\n")
    assert container_memory_limit(files) == GIB
    v2.write_text("garbage\n")
    assert container_memory_limit(files) is None


def test_quarry_up_fits_every_services_caches_into_one_container(monkeypatch, capsys):
    """`quarry up` in one container (podman run --memory 1g ... up): each service fitted its
    caches as if it had the container to itself (~2.3 GiB by the model in 1 GiB); up fits
    the sum of all its services' processes and hands each the sizes."""
    from quarry.cli.services import shared_caches, start_order

    env = {"QUARRY_BRANCH_MANAGER_WORKERS": "2"}
    monkeypatch.setattr(config, "container_memory_limit", lambda: None)
    shared_caches(env)
    assert env == {"QUARRY_BRANCH_MANAGER_WORKERS": "2"}  # no limit: nothing to fit
    monkeypatch.setattr(config, "container_memory_limit", lambda: 2 * GIB)
    shared_caches(env)
    settings = load_settings(env)
    processes = sum(settings.cache_processes_of(s) for s in start_order())
    assert processes == 4  # two branch-manager workers, the committer, the range-writer
    assert resident(settings, processes) <= MEMORY_LIMIT_SHARE * 2 * GIB
    assert "do not fit the container's memory limit of 2048 MiB" in capsys.readouterr().err
    # Each service then finds its own share fits: no second shrink.
    for service in ("branch-manager", "committer", "range-writer"):
        fitted, reason = settings.caches_fitted(2 * GIB, settings.cache_processes_of(service))
        assert fitted is settings and reason == ""
