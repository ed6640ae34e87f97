"""Files the CLI writes (`quarry get`, `quarry repo dump`): whole or not at all."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from quarry.cli.base import CliError

T = TypeVar("T")


def write_whole_file(
    target: Path,
    fill: Callable[[BinaryIO], T],
    *,
    force: bool,
    private: bool = False,
    hint: str = "",
) -> tuple[Path, T]:
    """Write `target` through `fill`: (the file written, what fill returned).

    Safety: never overwrites an existing file without `force`, and never leaves a partial
    file: the bytes go into a temporary file beside it, which takes its name only once
    `fill` returned (any check it makes included); on any failure it is removed. A link is
    followed (`force` replaces the file it points to, never the link); a pipe or a device
    is refused, never replaced. The mode: 0600 when `private`, else a new file's usual
    mode or the replaced file's own. `hint`: how to stream into a non-regular file."""
    target = Path(os.path.realpath(target))
    try:
        existing = target.stat()
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        # A pipe, a device (/dev/stdout), a socket: renaming over it would replace it (as
        # root, the system's /dev/stdout); streaming into it cannot be undone on a failure.
        raise CliError(
            "NOT_A_REGULAR_FILE",
            f"{target} is not a regular file" + (f"; {hint}" if hint else ""),
            "INVALID_ARGUMENT",
        )
    if existing is not None and not force:
        raise CliError(
            "FILE_EXISTS", f"{target} exists; pass --force to overwrite it", "ALREADY_EXISTS"
        )
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        if not private:
            # The mode a new file gets (mkstemp's is 0600), or the replaced file's own.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, stat.S_IMODE(existing.st_mode) if existing else 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            result = fill(fh)
        if force:
            os.replace(temporary, target)
        else:
            # link() refuses an existing target: a file created since the check above stays.
            try:
                os.link(temporary, target)
            except FileExistsError:
                raise CliError(
                    "FILE_EXISTS",
                    f"{target} exists; pass --force to overwrite it",
                    "ALREADY_EXISTS",
                ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return target, result
