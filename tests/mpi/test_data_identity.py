"""SPMD: a run's data files are the ones it opened, for the whole run, on every rank.

A file moved in under the training or the test file's name, or written in place, after
an epoch stops the next epoch on every rank (servers included) with one message naming
it; a label out of range that one worker reads is one error on every rank; training and
test files of two tasks are refused, naming both.
"""

import os

import pytest
from mpi4py import MPI

from minidp.io import filesystem
from minidp.io.datasets import synthetic
from minidp.io.mdp import HEADER_SIZE, write_mdp
from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

world = MPI.COMM_WORLD
TRAIN, TEST = 240, 60
RECORD = 4 * 28 * 28 + 8  # float32 (1, 28, 28) sample, int64 label


def write_pair(directory, seed=0, test_classes=10):
    """synthetic-train.mdp and synthetic-test.mdp of ``seed`` in ``directory`` (rank 0)."""
    data = synthetic(TRAIN, TEST, seed=seed, num_classes=10)
    write_mdp(f"{directory}/synthetic-train.mdp", data.x_train, data.y_train, 10)
    write_mdp(f"{directory}/synthetic-test.mdp", data.x_test, data.y_test, test_classes)


@pytest.fixture
def data_dir(tmp_path):
    """A data directory of this test's own (its files get replaced)."""
    path = world.bcast(str(tmp_path / "data") if world.rank == 0 else None)
    if world.rank == 0:
        os.makedirs(path)
        write_pair(path)
    world.Barrier()
    return path


def config(data_dir, tmp_path, **kw):
    out = world.bcast(str(tmp_path / "run"))
    return TrainConfig(**dict(dict(dataset="synthetic", model="mlp", epochs=3, batch_size=8,
                                   data_dir=data_dir, out=out, progress=False, comm_timeout=60),
                              **kw))


def trainer_for(data_dir, tmp_path, strategy, **kw):
    """A Trainer of ``strategy``, or None (after a check) where the world is too small."""
    if strategy == "asgd" and world.size == 1:
        with pytest.raises(ValueError, match="needs 1 server rank"):
            Trainer(config(data_dir, tmp_path, strategy=strategy, **kw))
        return None
    return Trainer(config(data_dir, tmp_path, strategy=strategy, **kw))


def one_error_on_every_rank(call):
    """The ValueError ``call()`` raises on every rank; the same message but for the rank."""
    with pytest.raises(ValueError) as refused:
        call()
    message = str(refused.value)
    assert message.startswith(f"rank {world.rank}: "), message
    messages = {m.split(": ", 1)[1] for m in world.allgather(message)}
    assert len(messages) == 1, messages
    return messages.pop()


def rewrite(path, how):
    """Rank 0 puts records of another seed, of the same size, under ``path``."""
    if world.rank == 0:
        split = "train" if path.endswith("train.mdp") else "test"
        data = synthetic(TRAIN, TEST, seed=1, num_classes=10)
        other = f"{path}.other"
        write_mdp(other, getattr(data, f"x_{split}"), getattr(data, f"y_{split}"), 10)
        assert os.path.getsize(other) == os.path.getsize(path)
        if how == "moved":
            os.replace(other, path)
        else:  # the same inode, other bytes, as `cp other path` does
            with open(other, "rb") as src, open(path, "r+b") as dst:
                dst.write(src.read())
            os.remove(other)
    world.Barrier()


@pytest.mark.parametrize("strategy", ["sync", "asgd"])
@pytest.mark.parametrize("reader", ["mpiio", "leader", "strided", "memory"])
def test_a_training_file_moved_in_after_an_epoch_stops_every_rank(data_dir, tmp_path, strategy,
                                                                  reader):
    """The issue's run: a same-size file of other labels moved in after epoch 1."""
    trainer = trainer_for(data_dir, tmp_path, strategy, reader=reader)
    if trainer is None:
        return
    path = f"{data_dir}/synthetic-train.mdp"
    opened = filesystem.stamp(path)
    first = trainer.train_epoch(0)
    assert first["samples"] > 0
    rewrite(path, "moved")
    now = filesystem.stamp(path)
    message = one_error_on_every_rank(lambda: trainer.train_epoch(1))
    found = [f"another file is under its name (inode {opened.inode} on device {opened.device} "
             f"when opened, now inode {now.inode} on device {now.device})"]
    if now.mtime_ns != opened.mtime_ns:  # written later, so most likely
        found.append(f"it was modified (mtime {opened.mtime_ns} ns when opened, now "
                     f"{now.mtime_ns} ns)")
    found.append(f"its header bytes changed (CRC-32 {opened.header_crc:#010x} when opened, "
                 f"now {now.header_crc:#010x})")
    assert message.startswith(f"dataset file '{path}' changed while the run used it: "
                              f"{'; '.join(found)}. The run stops"), message
    assert message.endswith("put the file the run opened back under its name and resume from "
                            "the last checkpoint, or start a new run")


@pytest.mark.parametrize("strategy", ["sync", "asgd"])
def test_a_test_file_written_in_place_stops_every_rank(data_dir, tmp_path, strategy):
    trainer = trainer_for(data_dir, tmp_path, strategy)
    if trainer is None:
        return
    path = f"{data_dir}/synthetic-test.mdp"
    opened = filesystem.stamp(path)
    trainer.train_epoch(0)
    rewrite(path, "in place")
    now = filesystem.stamp(path)
    assert (now.inode, now.size) == (opened.inode, opened.size)
    message = one_error_on_every_rank(lambda: trainer.train_epoch(1))
    assert message.startswith(f"dataset file '{path}' changed while the run used it: ")
    assert (f"its header bytes changed (CRC-32 {opened.header_crc:#010x} when opened, now "
            f"{now.header_crc:#010x})") in message
    assert "another file" not in message and "size" not in message


def test_unchanged_files_train_every_epoch_and_a_touch_is_a_change(data_dir, tmp_path):
    """Files that stay give epochs as before; a new mtime alone already stops the run."""
    trainer = Trainer(config(data_dir, tmp_path))
    samples = [trainer.train_epoch(e)["samples"] for e in range(2)]
    assert samples[0] == samples[1] > 0
    path = f"{data_dir}/synthetic-train.mdp"
    opened = filesystem.stamp(path)
    world.Barrier()
    if world.rank == 0:  # the same bytes, another modification time (as `touch` does)
        os.utime(path, ns=(opened.mtime_ns, opened.mtime_ns + 10 ** 9))
    world.Barrier()
    message = one_error_on_every_rank(lambda: trainer.train_epoch(2))
    assert message.startswith(f"dataset file '{path}' changed while the run used it: it was "
                              f"modified (mtime {opened.mtime_ns} ns when opened, now "
                              f"{opened.mtime_ns + 10 ** 9} ns). The run stops"), message


@pytest.mark.parametrize("strategy", ["sync", "asgd"])
def test_a_label_out_of_range_one_worker_reads_is_one_error_on_every_rank(data_dir, tmp_path,
                                                                         strategy):
    """The last record's label is 10 of 10 classes; --no-verify lets the file through."""
    path = f"{data_dir}/synthetic-train.mdp"
    if world.rank == 0:
        with open(path, "r+b") as f:
            f.seek(HEADER_SIZE + TRAIN * RECORD - 8)
            f.write((10).to_bytes(8, "little"))
    world.Barrier()
    trainer = trainer_for(data_dir, tmp_path, strategy, verify=False)
    if trainer is None:
        return
    message = one_error_on_every_rank(lambda: trainer.train_epoch(0))
    assert message == (f"dataset file '{path}': label 10 of record {TRAIN - 1} is outside the "
                       "allowed range [0, 10) of the header's 10 classes; the file's labels do "
                       "not fit its header: prepare it again")


def test_training_and_test_files_of_two_tasks_are_refused_naming_both(tmp_path):
    directory = world.bcast(str(tmp_path / "two") if world.rank == 0 else None)
    if world.rank == 0:
        os.makedirs(directory)
        write_pair(directory, test_classes=12)
    world.Barrier()
    message = one_error_on_every_rank(lambda: Trainer(config(directory, tmp_path)))
    assert message == (f"dataset files disagree: '{directory}/synthetic-train.mdp' has 10 classes "
                       "and samples of shape (1, 28, 28) and dtype float32, "
                       f"'{directory}/synthetic-test.mdp' has 12 classes and samples of shape "
                       "(1, 28, 28) and dtype float32; a run trains and evaluates one task: both "
                       "files must have the same number of classes, sample shape and sample "
                       "dtype")
