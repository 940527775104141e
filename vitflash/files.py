"""Files that are whole or absent: written beside their target, then renamed over it."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _read_umask() -> int:
    # os.umask only reads by setting: done once, at import, not while other threads (the GPU
    # data pipeline's, loader threads) may be creating files under a momentarily zero umask
    umask = os.umask(0)
    os.umask(umask)
    return umask


_UMASK = _read_umask()


@contextmanager
def written_whole(path: Path, suffix: str | None = None) -> Iterator[str]:
    """Yield a temporary file of this writer's own in `path`'s folder (the same filesystem, so
    the rename is atomic), named `.<name>.<random><suffix>` (default: `path`'s suffix, which
    numpy's savers keep), with the mode a plain open() would give; rename it over `path` when
    the block ends, remove it if the block raises. Several writers of one path (runs started
    together, ranks) never share a temporary file: the last rename wins, and a reader sees
    the old file or a new one, whole."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=path.suffix if suffix is None else suffix)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
