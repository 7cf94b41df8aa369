"""Atomic writes that never follow a link nor replace what is not a file (minidp.io.atomic)."""

import os

import pytest

from minidp.io.atomic import WriteFailed, atomic_write, write_into
from minidp.io.nofollow import Directory, WrongKind


def test_a_link_planted_at_the_temporary_name_is_never_written_through(tmp_path):
    """Before issue 40 the temporary name was NAME.tmp-PID: a link planted there was
    followed, and the file it pointed at overwritten."""
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs")
    target = tmp_path / "summary.json"
    os.symlink(outside, f"{target}.tmp-{os.getpid()}")
    atomic_write(str(target), lambda f: f.write("minidp's"))
    assert target.read_text() == "minidp's" and outside.read_text() == "theirs"
    assert os.path.islink(f"{target}.tmp-{os.getpid()}")  # left as it is
    assert sorted(os.listdir(tmp_path)) == ["outside.txt", "summary.json",
                                            f"summary.json.tmp-{os.getpid()}"]


@pytest.mark.parametrize("planted", ["link", "directory", "fifo"])
def test_only_a_regular_file_is_replaced(tmp_path, planted):
    target, outside = tmp_path / "model.npz", tmp_path / "outside"
    outside.write_text("theirs")
    {"link": lambda: os.symlink(outside, target), "directory": lambda: target.mkdir(),
     "fifo": lambda: os.mkfifo(target)}[planted]()
    kind = {"link": "a symbolic link", "directory": "a directory",
            "fifo": "a FIFO (named pipe)"}[planted]
    with pytest.raises(WriteFailed) as info:
        atomic_write(str(target), lambda f: f.write("x"))
    assert str(info.value) == (f"'{target}' is {kind}, not a regular file that minidp wrote; "
                               "minidp never follows, replaces or removes what it did not "
                               "write: move it away, or choose another directory")
    assert os.path.lexists(target) and outside.read_text() == "theirs"
    assert sorted(os.listdir(tmp_path)) == ["model.npz", "outside"]  # no temporary left
    target.unlink() if planted != "directory" else target.rmdir()
    atomic_write(str(target), lambda f: f.write("x"))
    atomic_write(str(target), lambda f: f.write("y"))  # a regular file: replaced
    assert target.read_text() == "y"


def test_a_tagged_temporary_name_is_the_writers_own(tmp_path):
    with Directory.open(str(tmp_path)) as d:
        (tmp_path / "run.json.tmp-abc").write_text("a killed job's half")
        write_into(d, "run.json", lambda f: f.write("{}"), tag="abc")
        assert sorted(os.listdir(tmp_path)) == ["run.json"]
        os.mkfifo(tmp_path / "run.json.tmp-abc")  # not a file: never removed, never opened
        with pytest.raises(WriteFailed, match=r"run.json.tmp-abc' is a FIFO"):
            write_into(d, "run.json", lambda f: f.write("[]"), tag="abc")
        assert (tmp_path / "run.json").read_text() == "{}"


def test_an_exclusive_write_never_replaces_anything(tmp_path):
    target = tmp_path / "synthetic-train.mdp"
    atomic_write(str(target), lambda f: f.write(b"first"), "wb", exclusive=True)
    for planted in ("file", "dangling link"):
        if planted == "dangling link":
            target.unlink()
            os.symlink(tmp_path / "nowhere", target)
        with pytest.raises(FileExistsError) as info:
            atomic_write(str(target), lambda f: f.write(b"second"), "wb", exclusive=True)
        assert info.value.filename == str(target)
        assert sorted(os.listdir(tmp_path)) == ["synthetic-train.mdp"]  # no temporary left
    assert not (tmp_path / "nowhere").exists()


def test_reading_takes_only_a_regular_file_and_never_blocks(tmp_path):
    os.mkfifo(tmp_path / "meta.json")  # opened for reading, a FIFO waits for a writer
    os.symlink("/etc/hostname", tmp_path / "rank-00000.npz")
    with Directory.open(str(tmp_path)) as d:
        with pytest.raises(WrongKind, match="meta.json' is a FIFO"):
            d.read("meta.json")
        with pytest.raises(WrongKind, match="rank-00000.npz' is a symbolic link"):
            d.open_read("rank-00000.npz")
        with pytest.raises(WrongKind, match="rank-00000.npz' is a symbolic link, not a "
                                            "directory"):
            d.child("rank-00000.npz")
