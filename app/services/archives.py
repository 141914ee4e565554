"""A run-directory folder (a model directory: `FOLDER_OUTPUTS`) as one tar or zip archive, streamed.

The archive is built on the fly, never stored: a header per entry (PAX format, so any path length), each
file's bytes padded to 512, two zero blocks, padded to tar's 10 KiB record. Every header depends only on
the entries' names, sizes, modes and mtimes, so the archive's size is known before the first byte
(Content-Length) and the same folder always gives the same bytes, so its sha256 can be served apart
(`<name>.tar.sha256`, in `sha256sum` format) by reading the archive once through the hash.
Symbolic links and anything but plain files and folders are left out: an archive holds only what is in
the folder itself.

The zip is built the same way (`zip_size`, `zip_stream`): every member stored as it is (a model's weights do
not compress), in ZIP64 form whatever its size (so a file past 4 GiB needs nothing else), its CRC-32
computed while it streams and written in the data descriptor after it (general-purpose flag bit 3) and in
the central directory, whose offsets are known from the sizes; the time of each member is its mtime in
DOS form. Python's zipfile, `unzip` and the platforms' own tools read it.
"""

from __future__ import annotations

import hashlib
import stat
import struct
import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 20 blocks
CHUNK = 1 << 20
TAR_MEDIA_TYPE = "application/x-tar"
ZIP_MEDIA_TYPE = "application/zip"


class ArchiveChanged(RuntimeError):
    """A file changed size while its archive was being streamed."""


@dataclass(frozen=True)
class Entry:
    path: Path  # on disk
    header: bytes  # its tar header (PAX records included)
    size: int  # of its data; 0 for a folder
    name: str  # in the archive (a folder's without its trailing slash)
    mode: int  # permission bits
    mtime: int
    folder: bool

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
        found.append(Entry(path, header(info), info.size, info.name, info.mode, info.mtime, info.isdir()))
    return found


def tar_size(listing: list[Entry]) -> int:
    body = sum(entry.length for entry in listing) + 2 * BLOCK
    return -(-body // RECORD) * RECORD


def data_of(entry: Entry) -> Iterator[bytes]:
    """The entry's file, exactly `entry.size` bytes in chunks; ArchiveChanged if it shrank meanwhile."""
    left = entry.size
    if left == 0:
        return
    with entry.path.open("rb") as handle:
        while left > 0:
            data = handle.read(min(CHUNK, left))
            if not data:
                raise ArchiveChanged(f"{entry.path} shrank while it was being archived")
            left -= len(data)
            yield data


def tar_stream(listing: list[Entry]) -> Iterator[bytes]:
    """The archive's bytes, exactly `tar_size(listing)` of them; ArchiveChanged if a file changed size."""
    written = 0
    for entry in listing:
        yield entry.header
        written += len(entry.header)
        if entry.size == 0:
            continue
        yield from data_of(entry)
        padding = -entry.size % BLOCK
        if padding:
            yield bytes(padding)
        written += entry.size + padding
    end = tar_size(listing) - written
    yield bytes(end)


def sha256_of(stream: Iterator[bytes]) -> str:
    """The sha256 of an archive's bytes (its `.sha256` line), read once through."""
    digest = hashlib.sha256()
    for data in stream:
        digest.update(data)
    return digest.hexdigest()


def tar_sha256(listing: list[Entry]) -> str:
    return sha256_of(tar_stream(listing))


# --- zip: stored members in ZIP64 form, CRC-32 in each data descriptor --------------------------------------
ZIP_VERSION = 45  # 4.5: ZIP64
ZIP_FLAGS = 0x0808  # bit 3: CRC-32 in the data descriptor; bit 11: names in UTF-8
UNKNOWN32 = 0xFFFFFFFF  # a 32-bit field whose value is in the ZIP64 extra field
LOCAL, DESCRIPTOR, CENTRAL = 30 + 20, 24, 46 + 28  # fixed lengths: header plus ZIP64 extra field
END = 56 + 20 + 22  # ZIP64 end of central directory record, its locator, the end of central directory


def zip_name(entry: Entry) -> bytes:
    return (entry.name + ("/" if entry.folder else "")).encode("utf-8", "surrogateescape")


def dos_time(mtime: int) -> tuple[int, int]:
    """(time, date) in MS-DOS form, UTC; a time before 1980 as 1980-01-01."""
    year, month, day, hour, minute, second = time.gmtime(max(mtime, 315532800))[:6]
    return hour << 11 | minute << 5 | second // 2, (year - 1980) << 9 | month << 5 | day


def zip_size(listing: list[Entry]) -> int:
    """The zip's length in bytes, known before its first byte (its Content-Length)."""
    names = sum(len(zip_name(entry)) for entry in listing)
    return sum(entry.size for entry in listing) + len(listing) * (LOCAL + DESCRIPTOR + CENTRAL) + 2 * names + END


def local_header(entry: Entry, name: bytes) -> bytes:
    clock, date = dos_time(entry.mtime)
    extra = struct.pack("<HHQQ", 1, 16, entry.size, entry.size)
    fixed = struct.pack(
        "<IHHHHHIIIHH",
        0x04034B50,
        ZIP_VERSION,
        ZIP_FLAGS,
        0,
        clock,
        date,
        0,
        UNKNOWN32,
        UNKNOWN32,
        len(name),
        len(extra),
    )
    return fixed + name + extra


def central_header(entry: Entry, name: bytes, crc: int, offset: int) -> bytes:
    clock, date = dos_time(entry.mtime)
    attributes = (stat.S_IFDIR if entry.folder else stat.S_IFREG) | entry.mode
    external = attributes << 16 | (0x10 if entry.folder else 0)  # Unix mode; MS-DOS directory bit
    extra = struct.pack("<HHQQQ", 1, 24, entry.size, entry.size, offset)
    fixed = struct.pack(
        "<IHHHHHHIIIHHHHHII",
        0x02014B50,
        3 << 8 | ZIP_VERSION,  # made on Unix
        ZIP_VERSION,
        ZIP_FLAGS,
        0,  # stored
        clock,
        date,
        crc,
        UNKNOWN32,
        UNKNOWN32,
        len(name),
        len(extra),
        0,
        0,
        0,
        external,
        UNKNOWN32,
    )
    return fixed + name + extra


def zip_end(count: int, start: int, size: int) -> bytes:
    """The ZIP64 end record, its locator and the classic end record (every field in the ZIP64 one)."""
    record = struct.pack(
        "<IQHHIIQQQQ", 0x06064B50, 44, 3 << 8 | ZIP_VERSION, ZIP_VERSION, 0, 0, count, count, size, start
    )
    locator = struct.pack("<IIQI", 0x07064B50, 0, start + size, 1)
    return record + locator + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, UNKNOWN32, UNKNOWN32, 0)


def zip_stream(listing: list[Entry]) -> Iterator[bytes]:
    """The zip's bytes, exactly `zip_size(listing)` of them; ArchiveChanged if a file changed size."""
    central, offset = [], 0
    for entry in listing:
        name = zip_name(entry)
        header = local_header(entry, name)
        yield header
        crc = 0
        for data in data_of(entry):
            crc = zlib.crc32(data, crc)
            yield data
        yield struct.pack("<IIQQ", 0x08074B50, crc, entry.size, entry.size)
        central.append(central_header(entry, name, crc, offset))
        offset += len(header) + entry.size + DESCRIPTOR
    directory = b"".join(central)
    yield directory
    yield zip_end(len(listing), offset, len(directory))


def zip_sha256(listing: list[Entry]) -> str:
    return sha256_of(zip_stream(listing))
