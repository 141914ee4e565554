"""A model folder as a tar archive (app/services/archives.py): its size is known before the first byte, the
same folder gives the same bytes, tarfile reads back every file byte for byte, and a link is left out."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

from app.services.archives import entries, tar_sha256, tar_size, tar_stream


def test_an_archive_is_its_announced_size_and_reads_back_byte_for_byte(tmp_path: Path) -> None:
    folder = tmp_path / "teacher_model"
    (folder / "deep" / ("x" * 120)).mkdir(parents=True)  # a path past ustar's 100 characters: a PAX header
    files = {
        "config.json": b"{}",
        "model.safetensors": os.urandom(70_001),
        "empty": b"",
        f"deep/{'x' * 120}/block.bin": b"\x01" * 512,
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "outside").symlink_to(tmp_path)  # a link out of the folder is not archived, nor what it leads to
    listing = entries(folder, "teacher_model")
    data = b"".join(tar_stream(listing))
    assert len(data) == tar_size(listing) and len(data) % tarfile.RECORDSIZE == 0
    assert b"".join(tar_stream(entries(folder, "teacher_model"))) == data
    assert tar_sha256(listing) == hashlib.sha256(data).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        got = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    assert got == {f"teacher_model/{name}": data for name, data in files.items()}
    assert not any("outside" in m.name for m in members) and members[0].name == "teacher_model"
