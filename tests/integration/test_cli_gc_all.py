"""`quarry gc run --all` against a real suite: one repository's failure does not stop the
others, exits 1, and (with --json) is one JSON object on stderr naming the repository while
stdout still holds the other repositories' reports. Spark itself is replaced here (its runs
are tests/e2e/test_spark_gc.py): what is tested is the CLI's handling of each outcome."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest

from quarry import errors
from quarry.cli.main import main as quarry_main
from support.suite import running_suite

pytest.importorskip("pyspark")


class Unsafe(errors.FailedPrecondition):
    reason = "GC_REFERENCES_INCOMPLETE"


def test_gc_run_all_reports_each_failed_repository_and_collects_the_others(tmp_path, monkeypatch):
    import quarry.spark.gc as gc_module
    import quarry.spark.session as session_module

    collected = []

    def collect_garbage(spark, repository, **kwargs):
        collected.append(repository)
        if repository == "gc-bad":
            raise Unsafe("a branch moved during the run", metadata={"branch": "main"})
        return SimpleNamespace(
            to_dict=lambda: {"repository": repository, "sweep": False},
            repository=repository,
            sweep=False,
            commits_retained=1,
            commits_expired=0,
            ephemeral_branches=[],
            objects_scanned=0,
            objects_in_grace=0,
            storage_namespace=f"local://{repository}",
            report_key="_quarry/gc/report.json",
            collectable={},
            deleted=0,
            collectable_count=0,
        )

    monkeypatch.setattr(gc_module, "collect_garbage", collect_garbage)
    monkeypatch.setattr(session_module, "local_session", lambda *args, **kwargs: None)
    with running_suite(tmp_path) as suite:
        client = suite.client()
        for name in ("gc-bad", "gc-ok"):
            client.create_repository(name, str(tmp_path / "lake" / name))
        args = ["--branch-manager", suite.targets["branch-manager"]]
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = quarry_main(["gc", "run", "--all", "--json", *args])
        assert code == 1, err.getvalue()
        assert collected == ["gc-bad", "gc-ok"]  # the failure did not stop the run
        assert json.loads(out.getvalue()) == [{"repository": "gc-ok", "sweep": False}]
        lines = err.getvalue().splitlines()
        assert len(lines) == 1, lines
        error = json.loads(lines[0])["error"]
        assert error["reason"] == "GC_REFERENCES_INCOMPLETE"
        assert error["code"] == "FAILED_PRECONDITION"
        assert error["metadata"] == {"branch": "main", "repository": "gc-bad"}
        assert error["message"].startswith("gc-bad: ")

        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = quarry_main(["gc", "run", "--all", *args])
        assert code == 1
        assert "repository" in out.getvalue() and "gc-ok" in out.getvalue()  # its report
        assert "GC_REFERENCES_INCOMPLETE" in err.getvalue() and "gc-bad:" in err.getvalue()
        assert "INTERNAL" not in err.getvalue()
        with pytest.raises(json.JSONDecodeError):
            json.loads(err.getvalue())  # text without --json
