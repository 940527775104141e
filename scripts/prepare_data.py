"""Put a dataset under the data root: unpack archives, or download CIFAR when online.

    python scripts/prepare_data.py --archive ../shared/data/cifar10-jpeg.tar.gz
    python scripts/prepare_data.py --archive ../shared/data/imagenette-train-{0,1,2}of3.tar.gz \
        ../shared/data/imagenette-val.tar.gz
    python scripts/prepare_data.py --download cifar10

The data root is --root, else $VITFLASH_DATA, else ./data (the default of configs/paths).
An archive is checked against a SHA256SUMS file beside it when there is one, and unpacked
with tarfile's "data" filter: members that would land outside the root, links pointing out
of it and device files are refused. It is unpacked into a temporary folder inside the root
and moved into place only once the whole archive has been read, its compressed stream's own
checksum (gzip's CRC) included: a truncated or damaged archive leaves the root as it was,
and is named as damaged even where the damage first shows as a member the filter refuses.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from tqdm.auto import tqdm


def check_exists(archive: Path) -> None:
    """Refuse a missing archive, or a folder given for one, before anything opens it."""
    if archive.is_dir():
        raise SystemExit(f"archive {archive} is a folder: pass the .tar.gz file itself")
    if not archive.is_file():
        raise SystemExit(f"archive {archive} does not exist (the shared archives are in ../shared/data)")


def check_sha256(archive: Path) -> None:
    """Compare `archive` with its line in a SHA256SUMS file beside it, if there is one."""
    sums = archive.parent / "SHA256SUMS"
    if not sums.is_file():
        return
    expected = {line.split()[-1].lstrip("*"): line.split()[0] for line in sums.read_text().splitlines() if line.strip()}
    if archive.name not in expected:
        return
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected[archive.name]:
        raise SystemExit(f"{archive} does not match its checksum in {sums}: the copy is damaged; copy it again")


def unpack(archive: Path, root: Path) -> None:
    """Extract a tar archive (any compression) into root, refusing unsafe members; nothing
    lands in root unless the whole archive reads back intact."""
    check_exists(archive)
    if not hasattr(tarfile, "data_filter"):
        raise SystemExit("unpacking safely needs tarfile's extraction filters: use Python >= 3.10.12 or >= 3.11.4")
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".unpacking-{archive.name}-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    # Beside the target, on its filesystem, so the final moves are renames.
    tmp = Path(tempfile.mkdtemp(prefix=f".unpacking-{archive.name}-", dir=root))
    try:
        refused = None
        try:
            with tarfile.open(archive) as tar:
                try:
                    for member in tqdm(tar, desc=f"unpacking {archive.name}", unit=" files", mininterval=1):
                        tar.extract(member, tmp, filter="data")
                except tarfile.FilterError as e:
                    refused = e
                # Read to the end of the compressed stream: gzip/bz2/xz check their CRC there.
                # After a refused member too: a damaged stream can decode into one (a byte
                # flipped mid-stream once made a regular file's header read as a special
                # file's), and then the damage is what to report.
                while tar.fileobj.read(1 << 20):
                    pass
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            raise SystemExit(
                f"cannot read {archive} ({type(e).__name__}: {e}): it is truncated, damaged or not a tar "
                f"archive. Nothing was unpacked into {root}; copy the archive again") from e
        if refused is not None:
            raise SystemExit(f"refusing to unpack {archive}: {refused}. Nothing was unpacked") from refused
        _move_into(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into(src: Path, dst: Path) -> None:
    """Rename each top-level entry of src into dst (one rename for a new dataset folder); where
    a folder exists already (e.g. a second shard of one tree), merge file by file."""
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if entry.is_dir() and target.is_dir():
            _move_into(entry, target)
        else:
            os.replace(entry, target)


def download(name: str, root: Path) -> None:
    """Fetch CIFAR-10/100 with torchvision (needs internet)."""
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[name]
    try:
        for train in (True, False):
            cls(str(root), train=train, download=True)
    except OSError as e:
        raise SystemExit(
            f"could not download {name} ({e}); offline, unpack an archive instead: "
            "--archive ../shared/data/cifar10-jpeg.tar.gz"
        ) from e


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(os.environ.get("VITFLASH_DATA", "data")),
                        help="data root (default: $VITFLASH_DATA or ./data)")
    parser.add_argument("--archive", type=Path, nargs="+", default=[], action="extend",
                        help="tar archive(s) to unpack into the root")
    parser.add_argument("--download", choices=["cifar10", "cifar100"], help="fetch with torchvision (online)")
    args = parser.parse_args(argv)
    if not args.archive and not args.download:
        parser.error("give --archive PATH ... or --download cifar10|cifar100")
    if args.root.exists() and not args.root.is_dir():
        parser.error(f"--root {args.root} is a file, not a folder: pass the folder to unpack into "
                     "(it is created when missing)")
    for archive in args.archive:  # every one is there before any is unpacked
        check_exists(archive)
    for archive in args.archive:
        check_sha256(archive)
        unpack(archive, args.root)
    if args.download:
        download(args.download, args.root)
    found = sorted(str(p.relative_to(args.root)) for p in args.root.glob("[!.]*/*") if p.is_dir())
    print(f"{args.root} holds: {', '.join(found) or 'nothing'}", file=sys.stderr)


if __name__ == "__main__":
    main()
