"""A model folder as a tar archive (app/services/archives.py): its size is known before the first byte, the
same folder gives the same bytes, tarfile reads back every file byte for byte, and a link is left out."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

from app.services.archives import entries, tar_sha256, tar_size, tar_stream, zip_sha256, zip_size, zip_stream


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


def test_a_zip_is_its_announced_size_and_zipfile_reads_back_every_file_with_its_crc(tmp_path: Path) -> None:
    folder = tmp_path / "searched_hf"
    (folder / "deep" / ("y" * 120)).mkdir(parents=True)
    files = {
        "config.json": b'{"model_type": "pipebd"}',
        "model.safetensors": os.urandom(70_001),
        "empty": b"",
        f"deep/{'y' * 120}/block.bin": b"\x02" * 513,
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "config.json").chmod(0o640)
    (folder / "outside").symlink_to(tmp_path)
    listing = entries(folder, "searched_hf")
    data = b"".join(zip_stream(listing))
    assert len(data) == zip_size(listing)
    assert b"".join(zip_stream(entries(folder, "searched_hf"))) == data  # the same folder, the same bytes
    assert zip_sha256(listing) == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None  # every member's CRC-32 checks
        infos = archive.infolist()
        got = {info.filename: archive.read(info) for info in infos if not info.is_dir()}
        modes = {info.filename: info.external_attr >> 16 for info in infos}
    assert got == {f"searched_hf/{name}": data for name, data in files.items()}
    assert infos[0].filename == "searched_hf/" and infos[0].is_dir() and not any("outside" in i.filename for i in infos)
    assert modes["searched_hf/config.json"] & 0o777 == 0o640
    extracted = tmp_path / "out"
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(extracted)
    assert (extracted / "searched_hf" / "model.safetensors").read_bytes() == files["model.safetensors"]
