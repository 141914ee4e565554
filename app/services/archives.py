"""A run-directory folder (a model directory: `FOLDER_OUTPUTS`) as one tar archive, streamed.

The archive is built on the fly, never stored: a header per entry (PAX format, so any path length), each
file's bytes padded to 512, two zero blocks, padded to tar's 10 KiB record. Every header depends only on
the entries' names, sizes, modes and mtimes, so the archive's size is known before the first byte
(Content-Length) and the same folder always gives the same bytes, so its sha256 can be served apart
(`<name>.tar.sha256`, in `sha256sum` format) by reading the archive once through the hash.
Symbolic links and anything but plain files and folders are left out: an archive holds only what is in
the folder itself.
"""

from __future__ import annotations

import hashlib
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 20 blocks
CHUNK = 1 << 20
TAR_MEDIA_TYPE = "application/x-tar"


class ArchiveChanged(RuntimeError):
    """A file changed size while its archive was being streamed."""


@dataclass(frozen=True)
class Entry:
    path: Path  # on disk
    header: bytes  # its tar header (PAX records included)
    size: int  # of its data; 0 for a folder

    @property
    def length(self) -> int:
        """Header plus data padded to a whole block."""
        return len(self.header) + -(-self.size // BLOCK) * BLOCK


def header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def entries(folder: Path, name: str) -> list[Entry]:
    """The folder itself under `name`, then every folder and file below it in sorted order."""
    found = []
    inside = folder.resolve()
    for path in [folder, *sorted(folder.rglob("*"))]:
        if not path.resolve().is_relative_to(inside):
            continue  # below a link that leads out of the folder
        status = path.lstat()
        relative = path.relative_to(folder).as_posix()
        info = tarfile.TarInfo(name if relative == "." else f"{name}/{relative}")
        info.mtime, info.mode = int(status.st_mtime), stat.S_IMODE(status.st_mode)
        if stat.S_ISDIR(status.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISREG(status.st_mode):
            info.size = status.st_size
        else:
            continue  # a link or a device: not part of a model directory
        found.append(Entry(path, header(info), info.size))
    return found


def tar_size(listing: list[Entry]) -> int:
    body = sum(entry.length for entry in listing) + 2 * BLOCK
    return -(-body // RECORD) * RECORD


def tar_stream(listing: list[Entry]) -> Iterator[bytes]:
    """The archive's bytes, exactly `tar_size(listing)` of them; ArchiveChanged if a file changed size."""
    written = 0
    for entry in listing:
        yield entry.header
        written += len(entry.header)
        if entry.size == 0:
            continue
        left = entry.size
        with entry.path.open("rb") as handle:
            while left > 0:
                data = handle.read(min(CHUNK, left))
                if not data:
                    raise ArchiveChanged(f"{entry.path} shrank while it was being archived")
                left -= len(data)
                yield data
        padding = -entry.size % BLOCK
        if padding:
            yield bytes(padding)
        written += entry.size + padding
    end = tar_size(listing) - written
    yield bytes(end)


def tar_sha256(listing: list[Entry]) -> str:
    digest = hashlib.sha256()
    for data in tar_stream(listing):
        digest.update(data)
    return digest.hexdigest()
