"""Two ranks sharing one GPU, for each strategy: the GPU run equals the CPU run."""

import pytest
from spmd import ROOT, run_spmd

pytestmark = pytest.mark.gpu


def test_every_deterministic_strategy_on_the_gpu_matches_the_cpu(synthetic_data_dir, tmp_path):
    launch = run_spmd([f"{ROOT}/tests/gpu/strategies_on_gpu.py", synthetic_data_dir,
                       str(tmp_path)], 2, timeout=600)
    assert not launch.killed and launch.returncode == 0, launch.output[-6000:]
    assert launch.output.count("GPU and CPU agree") == 12, launch.output[-3000:]
