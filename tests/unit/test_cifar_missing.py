"""A missing CIFAR-10 file says where the files come from and where they go."""

import os

import pytest

from minidp.io import load_dataset


def test_no_cifar_files_names_the_archive_its_source_and_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_dataset("cifar10", str(tmp_path))
    message = str(error.value)
    assert message.startswith(f"CIFAR-10 batch '{tmp_path}/data_batch_1' does not exist.")
    for words in ("download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/"
                  "cifar.html", f"tar xzf cifar-10-python.tar.gz -C {tmp_path})",
                  f"{tmp_path}/cifar-10-batches-py/ holding data_batch_1 ... data_batch_5 "
                  "and test_batch", f"point --data-dir at {tmp_path}"):
        assert words in message


def test_a_missing_batch_in_the_unpacked_folder_points_at_its_parent(tmp_path):
    unpacked = tmp_path / "cifar-10-batches-py"
    os.makedirs(unpacked)
    with pytest.raises(FileNotFoundError, match=rf"'{unpacked}/data_batch_1' does not exist.*"
                                                rf"-C {tmp_path}\).*--data-dir at {tmp_path}$"):
        load_dataset("cifar10", str(tmp_path))
