"""Data: the real data sets, the IDX reader, and (later layers) the minidp file format."""

from minidp.io.datasets import DATASETS, Dataset, first_available, load_dataset, synthetic
from minidp.io.idx import read_idx, write_idx

__all__ = ["DATASETS", "Dataset", "first_available", "load_dataset", "read_idx", "synthetic",
           "write_idx"]
