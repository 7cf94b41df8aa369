"""Data: the real data sets, the IDX reader, the minidp file format and its preparation."""

from minidp.io.datasets import DATASETS, Dataset, first_available, load_dataset, synthetic
from minidp.io.idx import read_idx, write_idx
from minidp.io.prepare import PREPARE_SEED, dataset_paths, prepare_dataset

__all__ = ["DATASETS", "Dataset", "PREPARE_SEED", "dataset_paths", "first_available",
           "load_dataset", "prepare_dataset", "read_idx", "synthetic", "write_idx"]
