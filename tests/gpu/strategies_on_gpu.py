"""SPMD script: every deterministic strategy trained on the CPU and on the GPU, compared.

Run by ``tests/gpu/test_strategies_on_gpu.py`` as ``mpiexec -n 2 python -m mpi4py
strategies_on_gpu.py DATA_DIR OUT_DIR``: both ranks share one GPU. At two ranks the
parameter-server and elastic strategies have one server and one worker, so their
order of arrival is fixed and the results must agree to rounding (float64).
"""

import sys

import numpy as np
from mpi4py import MPI

from minidp import backend
from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

STRATEGIES = ["sync", "hsgd", "hbsgd", "daso", "easgd-sync", "asgd", "amsgd", "softsync",
              "dbs", "easgd-rr", "easgd-async", "measgd-async"]


def train(strategy, device_backend, data_dir, out):
    backend.set_backend(device_backend)
    config = TrainConfig(dataset="synthetic", model="lenet5", strategy=strategy, epochs=2,
                         batch_size=8, lr=0.05, momentum=0.9, dtype="float64",
                         train_samples=160, test_samples=40, data_dir=data_dir,
                         out=f"{out}/{strategy}-{device_backend}", ranks_per_node=1,
                         progress=False)
    trainer = Trainer(config)
    summary = trainer.fit()
    assert type(trainer.compute).__name__ == ("DeviceReplica" if device_backend == "cupy"
                                              else "HostCompute")
    return trainer.consensus_state(), summary["final"]["test_loss"]


def main(data_dir, out):
    for strategy in STRATEGIES:
        cpu, cpu_loss = train(strategy, "numpy", data_dir, out)
        gpu, gpu_loss = train(strategy, "cupy", data_dir, out)
        assert np.isclose(gpu_loss, cpu_loss, rtol=1e-8), (strategy, gpu_loss, cpu_loss)
        for key in cpu:
            np.testing.assert_allclose(gpu[key], cpu[key], rtol=1e-8, atol=1e-11,
                                       err_msg=f"{strategy}: {key}")
        if MPI.COMM_WORLD.rank == 0:
            print(f"{strategy}: GPU and CPU agree (test loss {gpu_loss:.6f})", flush=True)
    backend.set_backend("numpy")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
