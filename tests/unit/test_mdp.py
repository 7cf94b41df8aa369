"""The .mdp format: exact round trip, and every corruption caught with a clear error."""

import os
import stat
import zlib

import numpy as np
import pytest

from minidp.io import mdp
from minidp.kernels.checksum import _checksum_kernel, checksum_reference


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (37, 1, 5, 3), dtype=np.uint8), rng.integers(0, 10, 37)


def test_round_trip_is_exact_for_several_dtypes(tmp_path, arrays):
    x, y = arrays
    for xs, ys in ((x, y), (x.astype(np.float32) / 7, y.astype(np.uint8))):
        path = str(tmp_path / "d.mdp")
        header = mdp.write_mdp(path, xs, ys, 10)
        x2, y2, h2 = mdp.read_mdp(path)
        np.testing.assert_array_equal(x2, xs)
        np.testing.assert_array_equal(y2, ys)
        assert h2 == header and h2.count == 37 and h2.sample_shape == xs.shape[1:]
        assert os.path.getsize(path) == mdp.HEADER_SIZE + 37 * header.record_size


def test_checksum_kernel_matches_reference_and_combines():
    data = np.random.default_rng(1).integers(0, 256, 10_007, dtype=np.uint8)
    whole = checksum_reference(data, 0)
    s1, s2 = _checksum_kernel(data, np.uint64(0))
    assert (int(s1), int(s2)) == whole
    parts = mdp.add_checksums(mdp.checksum(data[:4000], 0), mdp.checksum(data[4000:], 4000))
    assert parts == whole
    swapped = data.copy()
    swapped[[0, 1]] = data[[1, 0]]
    if data[0] != data[1]:
        assert mdp.checksum(swapped) != whole


def write(tmp_path, arrays):
    path = str(tmp_path / "d.mdp")
    mdp.write_mdp(path, *arrays, 10)
    return path


def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def patch_sealed(path, offset, data):
    """Change header bytes and seal the header again: as a writer of those values would."""
    patch(path, offset, data)
    with open(path, "r+b") as f:
        raw = f.read(mdp.HEADER_SIZE)
        f.seek(0)
        f.write(mdp.seal(raw))


def test_truncated_file(tmp_path, arrays):
    path = write(tmp_path, arrays)
    os.truncate(path, os.path.getsize(path) - 5)
    with pytest.raises(ValueError, match=r"d.mdp' is truncated: the header counts 37 records"):
        mdp.read_header(path)
    os.truncate(path, 50)
    with pytest.raises(ValueError, match="shorter than the 128-byte header"):
        mdp.read_header(path)


def test_wrong_magic_and_version(tmp_path, arrays):
    path = write(tmp_path, arrays)
    patch(path, 0, b"NOTMINID")
    with pytest.raises(ValueError, match="wrong magic.*not a minidp dataset file"):
        mdp.read_header(path)
    path = write(tmp_path, arrays)
    patch_sealed(path, 8, (7).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="version 7"):
        mdp.read_header(path)


def test_count_that_disagrees_with_the_size(tmp_path, arrays):
    path = write(tmp_path, arrays)
    patch_sealed(path, 16, (36).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="longer than its header says: the header counts 36"):
        mdp.read_header(path)


def test_checksum_mismatch(tmp_path, arrays):
    path = write(tmp_path, arrays)
    with open(path, "r+b") as f:
        f.seek(mdp.HEADER_SIZE + 100)
        byte = f.read(1)
        f.seek(mdp.HEADER_SIZE + 100)
        f.write(bytes([(byte[0] + 1) % 256]))
    with pytest.raises(ValueError, match="checksum mismatch"):
        mdp.read_mdp(path)


def test_checksum_mismatch_names_the_byte_range_and_a_single_changed_byte(tmp_path, arrays):
    path = write(tmp_path, arrays)
    end, old = os.path.getsize(path), open(path, "rb").read()[228]
    patch(path, mdp.HEADER_SIZE + 100, bytes([old ^ 0x10]))
    with pytest.raises(ValueError) as refused:
        mdp.read_mdp(path)
    delta = f"{(old ^ 0x10) - old:+d}"
    assert str(refused.value) == (
        f"dataset file '{path}': checksum mismatch over payload bytes 128 to {end} (the 37 "
        f"records): the payload is corrupt; if a single byte changed, it is the one at file "
        f"offset 228 (record 4), by {delta}; prepare the file again")
    patch(path, mdp.HEADER_SIZE + 300, b"\x00\x00\x00")  # several bytes: the range only
    with pytest.raises(ValueError, match=rf"over payload bytes 128 to {end} \(the 37 records\): "
                                         r"the payload is corrupt; (if a single|prepare)"):
        mdp.read_mdp(path)


def test_collective_verification_reads_in_pieces_and_names_the_range(tmp_path, arrays,
                                                                     monkeypatch):
    from mpi4py import MPI

    from minidp.io import readers

    path = write(tmp_path, arrays)
    header = mdp.read_header(path)
    monkeypatch.setattr(readers.base, "VERIFY_PIECE", 7)  # 851 payload bytes in 122 pieces
    readers.verify_checksum(path, header, MPI.COMM_WORLD)
    patch(path, mdp.HEADER_SIZE + 850, b"\xff")  # the last label's high byte, 0 before
    with pytest.raises(ValueError, match=rf"^rank 0: dataset file '{path}': checksum mismatch "
                                         r"over payload bytes 128 to 979 \(the 37 records\).*"
                                         r"file offset 978 \(record 36\)"):
        readers.verify_checksum(path, header, MPI.COMM_WORLD)


@pytest.mark.parametrize("offset, value, message", [
    # dims that claim 4 * (2**32 - 1) bytes per record: refused before NumPy sees the shape
    (36, b"\xff" * 12, r"record size 23 disagrees with shape \(4294967295, 4294967295, "
                        r"4294967295\) of uint8 plus a int64 label \(79228162458924105385300197383 "
                        r"bytes\)"),
    (16, (2 ** 60).to_bytes(8, "little"), r"is truncated: the header counts 1152921504606846976 "
                                          r"records of 23 bytes"),
    (52, b"|O8\0\0\0\0\0", r"sample dtype '\|O8' at offset 52, allowed: a NumPy number dtype "
                             r"string of kind bool, int, uint, float, complex"),
    (60, b"<f8\0\0\0\0\0", r"label dtype '<f8' at offset 60, allowed: .* of kind int, uint"),
    (52, b"i4,i4\0\0\0", r"sample dtype 'i4,i4' at offset 52"),
    (52, b"\xff\xfe<f3\0\0\0", r"sample dtype '\ufffd\ufffd<f3' at offset 52"),
    (32, (5).to_bytes(4, "little"), r"sample ndim 5 at offset 32, allowed: 0 to 4"),
    (44, (0).to_bytes(4, "little"), r"sample shape \(1, 5, 0, 0\) at offset 36 for ndim 3, "
                                    r"allowed: 3 dims >= 1, then zeros"),
    (68, bytes(4), r"number of classes 0 at offset 68, allowed: >= 1"),
])
def test_header_fields_are_checked_before_anything_is_allocated(tmp_path, arrays, offset, value,
                                                                message):
    path = write(tmp_path, arrays)
    patch_sealed(path, offset, value)
    with pytest.raises(ValueError, match=rf"dataset file '.*d.mdp'.*{message}"):
        mdp.read_header(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="'/nonexistent.mdp' does not exist"):
        mdp.read_header("/nonexistent.mdp")


def test_failed_write_leaves_nothing_half_written(tmp_path, arrays, monkeypatch):
    path = str(tmp_path / "d.mdp")
    mdp.write_mdp(path, *arrays, 10)
    before = open(path, "rb").read()

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(mdp, "checksum", broken)
    with pytest.raises(OSError, match="disk full"):
        mdp.write_mdp(path, *arrays, 10)
    assert open(path, "rb").read() == before  # old file intact
    assert os.listdir(tmp_path) == ["d.mdp"]  # no temporary left behind


def test_bad_arguments(tmp_path, arrays):
    x, y = arrays
    with pytest.raises(ValueError, match="37 samples but 36 labels"):
        mdp.write_mdp(str(tmp_path / "a.mdp"), x, y[:-1], 10)
    with pytest.raises(TypeError, match="labels must be integers"):
        mdp.write_mdp(str(tmp_path / "a.mdp"), x, y.astype(np.float32), 10)


def test_shuffled_flag_round_trips_at_offset_88(tmp_path, arrays):
    path = str(tmp_path / "d.mdp")
    for shuffled, flags in ((True, 1), (False, 0)):
        header = mdp.write_mdp(path, *arrays, 10, shuffled=shuffled)
        assert header.shuffled is shuffled and header.flags == flags
        with open(path, "rb") as f:
            raw = f.read(mdp.HEADER_SIZE)
        assert int.from_bytes(raw[88:92], "little") == flags
        assert int.from_bytes(raw[92:96], "little") == zlib.crc32(raw[:92] + bytes(36))
        assert raw[96:] == bytes(32)  # the rest of the padding stays zero
        read = mdp.read_header(path)
        assert read.shuffled is shuffled and read == header
        x, y, h = mdp.read_mdp(path)
        assert h.shuffled is shuffled
        np.testing.assert_array_equal(y, arrays[1])


def test_file_without_flags_reads_as_not_shuffled(tmp_path, arrays):
    path = str(tmp_path / "d.mdp")
    mdp.write_mdp(path, *arrays, 10, shuffled=True)
    patch_sealed(path, 88, bytes(4))  # what a file written before the flags existed holds
    assert mdp.read_header(path).shuffled is False


def test_unknown_flag_bits_are_refused(tmp_path, arrays):
    path = write(tmp_path, arrays)
    patch_sealed(path, 88, (1 | 4).to_bytes(4, "little"))
    with pytest.raises(ValueError, match=r"d.mdp': unknown flag bits 0x4 in flags 0x5"):
        mdp.read_header(path)
    patch_sealed(path, 88, (1 << 31).to_bytes(4, "little"))
    with pytest.raises(ValueError, match=r"unknown flag bits 0x80000000.*knows only 0x1"):
        mdp.read_mdp(path)


def test_labels_out_of_range_are_refused_when_written(tmp_path, arrays):
    x, y = arrays
    path = str(tmp_path / "a.mdp")
    high = y.copy()
    high[5] = 10
    with pytest.raises(ValueError, match=r"'.*a.mdp': label 10 \(record 5\) is outside the "
                                         r"allowed range \[0, 10\) for num_classes=10"):
        mdp.write_mdp(path, x, high, 10)
    low = y.copy()
    low[[2, 30]] = -1
    with pytest.raises(ValueError, match=r"label -1 \(record 2\).*\[0, 10\)"):
        mdp.write_mdp(path, x, low, 10)
    first = int(np.flatnonzero(y >= 4)[0])
    with pytest.raises(ValueError, match=rf"label {y[first]} \(record {first}\).*\[0, 4\)"):
        mdp.write_mdp(path, x, y, 4)
    with pytest.raises(ValueError, match="num_classes: got 0, allowed: an int >= 1"):
        mdp.write_mdp(path, x[:0], y[:0], 0)
    with pytest.raises(TypeError, match=r"num_classes: got 10.0, allowed: an int >= 1"):
        mdp.write_mdp(path, x, y, 10.0)
    assert os.listdir(tmp_path) == []  # refused before anything was written
    mdp.write_mdp(path, x, np.full(37, 9), 10)  # the top of the range is allowed
    assert mdp.read_mdp(path)[1].max() == 9


def test_labels_out_of_range_are_refused_when_decoded(tmp_path, arrays):
    x, y = arrays
    path = write(tmp_path, arrays)
    patch_sealed(path, 68, (5).to_bytes(4, "little"))  # the header now claims 5 classes
    first = int(np.flatnonzero(y >= 5)[0])
    with pytest.raises(ValueError, match=rf"d.mdp': label {y[first]} of record {first} is "
                                         r"outside the allowed range \[0, 5\) of the header's "
                                         r"5 classes; the file's labels do not fit its header"):
        mdp.read_mdp(path)
    header = mdp.read_header(path)
    raw = np.fromfile(path, dtype=np.uint8, offset=mdp.HEADER_SIZE)
    in_range = np.flatnonzero(y < 5)
    records = raw.view(header.record_dtype)[in_range]
    x2, y2 = mdp.decode(records, header)  # a block whose labels all fit decodes
    np.testing.assert_array_equal(y2, y[in_range])
    np.testing.assert_array_equal(x2, x[in_range])
    empty_x, empty_y = mdp.decode(raw[:0], header)
    assert empty_x.shape == (0, 1, 5, 3) and empty_y.shape == (0,)


def test_every_bit_of_the_header_is_covered_by_its_checksum(tmp_path, arrays):
    path = write(tmp_path, arrays)
    whole = open(path, "rb").read()
    for bit in range(8 * mdp.HEADER_SIZE):
        flipped = bytearray(whole[:mdp.HEADER_SIZE])
        flipped[bit // 8] ^= 1 << bit % 8
        with open(path, "r+b") as f:
            f.write(flipped)
        with pytest.raises(ValueError, match=r"d.mdp': (header checksum mismatch .* the header "
                                             r"is corrupt; prepare the file again|wrong magic)"):
            mdp.read_header(path)
    # the flips: classes 10 -> 138 at byte 68; a dimension of 2**16 or 2**24 more
    for offset, mask in ((68, 0x80), (70, 0x01), (71, 0x01), (40, 0x01), (42, 0x01)):
        flipped = bytearray(whole)
        flipped[offset] ^= mask
        with open(path, "wb") as f:
            f.write(flipped)
        with pytest.raises(ValueError, match="header checksum mismatch"):
            mdp.read_mdp(path)


def test_a_version_1_file_is_refused_as_old(tmp_path, arrays):
    path = write(tmp_path, arrays)
    patch(path, 8, (1).to_bytes(4, "little"))
    patch(path, 92, bytes(4))  # version 1 had no header checksum: zeros there
    with pytest.raises(mdp.OldVersion, match=r"d.mdp' is of format version 1, whose header "
                                             r"has no checksum; this minidp reads version 2"):
        mdp.read_header(path)


def test_a_directory_or_fifo_is_named_for_what_it_is(tmp_path):
    (tmp_path / "dir.mdp").mkdir()
    os.mkfifo(tmp_path / "fifo.mdp")
    with pytest.raises(ValueError, match=r"dir.mdp' is a directory, not a regular file"):
        mdp.read_header(str(tmp_path / "dir.mdp"))
    with pytest.raises(ValueError, match=r"fifo.mdp' is a FIFO \(named pipe\), not a regular"):
        mdp.read_header(str(tmp_path / "fifo.mdp"))  # never opened: it would block
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo.mdp").st_mode)


def test_an_exclusive_write_never_replaces_and_leaves_nothing_when_it_fails(tmp_path, arrays,
                                                                            monkeypatch):
    path = tmp_path / "d.mdp"
    path.write_bytes(b"the user's")
    os.symlink(tmp_path / "nowhere", tmp_path / "link.mdp")
    for name in ("d.mdp", "link.mdp"):  # a file, a dangling link: neither replaced nor followed
        with pytest.raises(FileExistsError, match=f"^'{tmp_path}/{name}' exists .*minidp never "
                                                  "replaces a file, it is left as it is$"):
            mdp.write_mdp(str(tmp_path / name), *arrays, 10, exclusive=True)
    assert path.read_bytes() == b"the user's" and not (tmp_path / "nowhere").exists()
    header = mdp.write_mdp(str(tmp_path / "new.mdp"), *arrays, 10, exclusive=True)
    assert mdp.read_mdp(str(tmp_path / "new.mdp"))[2] == header

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(mdp, "checksum", broken)
    with pytest.raises(OSError, match=f"cannot write '{tmp_path}/other.mdp': disk full"):
        mdp.write_mdp(str(tmp_path / "other.mdp"), *arrays, 10, exclusive=True)
    assert sorted(os.listdir(tmp_path)) == ["d.mdp", "link.mdp", "new.mdp"]  # no temporary
