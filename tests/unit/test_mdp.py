"""The .mdp format: exact round trip, and every corruption caught with a clear error."""

import os

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
    patch(path, 8, (7).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="version 7"):
        mdp.read_header(path)


def test_count_that_disagrees_with_the_size(tmp_path, arrays):
    path = write(tmp_path, arrays)
    patch(path, 16, (36).to_bytes(8, "little"))
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
