"""What the driver and the executors of a Quarry Spark job share: `quarry://` URIs, the
connection to the services (picklable, so it travels in task closures), and the naming of
ephemeral branches and job files.

Credentials: the driver's (quarry.client.load_credentials) ride in the Connection, so
executors log in themselves without a credentials file or environment of their own. Safety
rule: they travel only inside the pickled task closure, never in a Spark conf, an option or
any string Spark logs or shows in a plan, and the Connection's repr leaves them out.
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quarry import errors

# A job id matches JOB_ID_PATTERN; its files live under JOB_DATA_PREFIX<job id>/ (the
# object-store layout, quarry.blob.layout, owns both).
from quarry.blob.layout import JOB_DATA_PREFIX as JOB_DATA_PREFIX
from quarry.blob.layout import JOB_ID_PATTERN as JOB_ID_PATTERN

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from quarry.client import Client
    from quarry.client.credentials import Credentials
    from quarry.config import Settings
    from quarry.runtime.tls import ChannelSecurity

SCHEME = "quarry://"
# Ephemeral branches of Spark writes: `_quarry-spark-<UTC time>-<random>`. The time in the
# name lets a sweep find the ones a dead driver left behind without any other record.
EPHEMERAL_PREFIX = "_quarry-spark-"
_JOB_TIME = "%Y%m%dT%H%M%S"
_EPHEMERAL = re.compile(r"^_quarry-spark-(\d{8}T\d{6})-[0-9a-f]{12}$")


class InvalidQuarryUri(errors.InvalidArgument):
    reason = "INVALID_QUARRY_URI"


@dataclass(frozen=True)
class QuarryUri:
    repository: str
    ref: str
    path: str  # "" = the whole repository

    @property
    def prefix(self) -> str:
        """The path as a folder prefix ("tables/t1/"; "" for the root)."""
        path = self.path.strip("/")
        return path + "/" if path else ""

    def __str__(self) -> str:
        quote = urllib.parse.quote
        return (
            f"{SCHEME}{quote(self.repository, safe='')}/{quote(self.ref, safe='')}/"
            f"{quote(self.path)}"
        )


def parse_uri(uri: str) -> QuarryUri:
    """`quarry://REPO/REF/PATH` (PATH optional). Refs never contain '/', so the first two
    segments are always the repository and the ref."""
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        raise InvalidQuarryUri(f"{uri!r} is not a quarry:// URI (quarry://REPO/REF/PATH)")
    # Split first, then decode each part: an escaped '/' (%2F) never becomes a separator.
    repository, _, rest = uri[len(SCHEME) :].partition("/")
    ref, _, path = rest.partition("/")
    repository, ref, path = (urllib.parse.unquote(part) for part in (repository, ref, path))
    if not repository or not ref:
        raise InvalidQuarryUri(f"{uri!r}: expected quarry://REPO/REF/PATH")
    return QuarryUri(repository, ref, path.lstrip("/"))


@dataclass(frozen=True)
class Connection:
    """Where the services are, for the driver and (pickled) for every executor."""

    branch_manager: str
    committer: str
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    timeout: float = 60.0
    # The driver's credentials for the executors (module docstring); None: each process
    # finds its own (environment, QUARRY_HOME), as the Client does.
    credentials: Credentials | None = field(default=None, repr=False)
    # The driver's TLS material (CA bundle, client certificate and key) for the executors,
    # like the credentials, when the driver uses TLS; None: each process reads its own
    # QUARRY_TLS_* settings.
    security: ChannelSecurity | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Connection:
        from quarry.client.credentials import load_credentials
        from quarry.config import load_settings
        from quarry.runtime.tls import channel_security

        settings = settings if settings is not None else load_settings()
        security = channel_security(settings)
        return cls(
            settings.branch_manager_address,
            settings.committer_address,
            settings.s3_endpoint_url,
            settings.s3_region,
            credentials=load_credentials(settings.home),
            security=security if security.tls else None,
        )

    @classmethod
    def resolve(
        cls, spark: SparkSession | None = None, connection: Connection | None = None
    ) -> Connection:
        """An explicit connection; else the session's `spark.quarry.branchManager` /
        `spark.quarry.committer` (and `spark.quarry.s3EndpointUrl`); else the QUARRY_*
        settings of this process."""
        if connection is not None:
            return connection
        base = cls.from_settings()
        if spark is None:
            return base
        conf = spark.conf

        def setting(key: str, default: str) -> str:
            value = conf.get(key, default)  # never None with a default (the stubs say maybe)
            return default if value is None else value

        return cls(
            setting("spark.quarry.branchManager", base.branch_manager),
            setting("spark.quarry.committer", base.committer),
            setting("spark.quarry.s3EndpointUrl", base.s3_endpoint_url),
            setting("spark.quarry.s3Region", base.s3_region),
            credentials=base.credentials,
            security=base.security,
        )


_clients: dict[tuple[Connection, bool], Client] = {}
_clients_lock = threading.Lock()


def open_client(connection: Connection) -> Client:
    """A new Client as `connection` says: its addresses, timeout, TLS and credentials (the
    driver's and the executors' calls are the same user's: a driver that left the
    credentials out called as whoever the environment named)."""
    from quarry.client import Client

    return Client(
        connection.branch_manager,
        connection.committer,
        timeout=connection.timeout,
        credentials=connection.credentials,
        security=connection.security,
    )


def client_for(connection: Connection) -> Client:
    """One Client (so one channel per service) per process and connection: executors'
    Python workers are reused across tasks, so every task of a worker shares it."""
    from quarry import telemetry

    key = (connection, telemetry.tracing_enabled())
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = open_client(connection)
        return client


def new_job_id(now: _dt.datetime | None = None) -> str:
    now = (now or _dt.datetime.now(_dt.UTC)).astimezone(_dt.UTC)
    return f"{now.strftime(_JOB_TIME)}-{secrets.token_hex(6)}"


def ephemeral_branch(job_id: str) -> str:
    return EPHEMERAL_PREFIX + job_id


def ephemeral_created_at(branch: str) -> _dt.datetime | None:
    """When the ephemeral branch was made (from its name); None if it is not one."""
    match = _EPHEMERAL.match(branch)
    if not match:
        return None
    try:
        return _dt.datetime.strptime(match.group(1), _JOB_TIME).replace(tzinfo=_dt.UTC)
    except ValueError:  # shaped like one but not a real time: a user's branch, not ours
        return None


def job_of_branch(branch: str) -> str:
    return branch[len(EPHEMERAL_PREFIX) :]
