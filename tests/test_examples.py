"""Every script in examples/ runs, small, as a user runs it, and shows what it claims.

The MPI examples run in turn in one 4-rank job (tests/scripts/run_examples.py: each as
``python -m mpi4py examples/NAME.py`` would run it), ``train_single.py`` as one process;
all on the first 1,024 mnist-5k training samples for an epoch or three, so an example
that breaks fails here.
"""

import glob
import os
import re
import subprocess
import sys

import pytest
from spmd import ROOT, run_spmd

# `make test` runs the module on one pytest-xdist worker: its fixtures are shared.
pytestmark = pytest.mark.xdist_group("examples")

SMALL = ["--dataset", "mnist-5k", "--train-samples", "1024", "--test-samples", "400",
         "--epochs", "1"]
# daso.py: warm-up, one cycling epoch, cool-down; the hand-written loops: two epochs to learn;
# easgd.py: its own two epochs. One epoch is 8 exchanges per worker, and Hogwild's lost
# pulls (two workers adding to one centre with no lock) left its centre at 49.75-55% in
# about one run of six, 68-74% otherwise; after two epochs, 74.5-81% in six of six.
EXTRA = {"sync.py": ["--ranks-per-node", "2", "--epochs", "2"], "daso.py": ["--epochs", "3"],
         "easgd.py": ["--epochs", "2"], "train_single.py": ["--epochs", "2"]}
SINGLE_PROCESS = "train_single.py"
NOT_EXAMPLES = ("common.py",)  # the examples' shared flags


# A hang guard, never a bound a test asserts: on a loaded machine the first job also
# compiles every kernel (minutes), and a fixture that times out fails every test of the file.
HANG_S = 900


def examples():
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py"))
                  if os.path.basename(p) not in NOT_EXAMPLES)


def percentages(text):
    return [float(v) / 100 for v in re.findall(r"([\d.]+)%", text)]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """{example: its output} of one job over every MPI example (cwd: a fresh directory)."""
    cwd = tmp_path_factory.mktemp("examples")
    data = ["--data-dir", str(cwd / "data")]
    jobs = [" ".join([name, *SMALL, *data, *EXTRA.get(name, [])]) for name in examples()
            if name != SINGLE_PROCESS]
    launch = run_spmd([os.path.join(ROOT, "tests", "scripts", "run_examples.py"), str(cwd),
                       *jobs], 4, timeout=HANG_S,
                      env={"MINIDP_NUM_THREADS": "1", "MINIDP_PROGRESS_SECONDS": "0"})
    assert launch.returncode == 0 and not launch.killed, launch.output[-6000:]
    parts = re.split(r"^== (\S+)\n", launch.output, flags=re.M)
    outputs = dict(zip(parts[1::2], parts[2::2]))
    single = subprocess.run([sys.executable, os.path.join(ROOT, "examples", SINGLE_PROCESS),
                             *SMALL, *data, *EXTRA[SINGLE_PROCESS]], cwd=cwd,
                            capture_output=True, text=True,
                            timeout=HANG_S, env=dict(os.environ, MINIDP_NUM_THREADS="1"))
    assert single.returncode == 0, single.stdout + single.stderr
    outputs[SINGLE_PROCESS] = single.stdout
    return outputs


def test_every_example_ran(ran):
    assert set(ran) == set(examples())
    assert {"asgd.py", "daso.py", "easgd.py", "hbsgd.py", "hsgd.py", "sync.py",
            "train_single.py"} <= set(ran)


def test_a_job_whose_output_is_piped_shows_no_progress(ran):
    # hsgd.py leaves progress on; its output goes through pipes, as in CI or a batch job
    # (and lines, were they shown, would come at every step: MINIDP_PROGRESS_SECONDS=0)
    assert "out: runs/example-hsgd" in ran["hsgd.py"]
    assert not re.search(r"^epoch \d+/\d+: step |step/s", "".join(ran.values()), re.M)


def test_the_hand_written_loop_and_the_single_process_one_learn(ran):
    for name in ("sync.py", SINGLE_PROCESS):
        accuracy = percentages("\n".join(line for line in ran[name].splitlines()
                                         if line.startswith("epoch ")))
        assert len(accuracy) == 2 and accuracy[1] > 0.2, ran[name]


def test_daso_example_drives_train_epoch_through_its_schedule(ran):
    lines = [line for line in ran["daso.py"].splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1", "epoch 2", "epoch 3"]
    # warm-up blocks every batch, the cycling epoch skips, the cool-down blocks again
    assert "(B, S, L) = (0, 0, 0)" in lines[0] and "(B, S, L) = (0, 0, 0)" in lines[2]
    assert "(B, S, L) = (0, 0, 0)" not in lines[1]
    assert "warning: daso" not in ran["daso.py"]  # epoch 2 cycles: nothing to warn of
    assert percentages(lines[2])[-1] > 0.5


def test_examples_show_what_their_docstrings_claim(ran):
    # asgd.py: dbs gives the straggler (rank 3, 6x slower) the smallest batch
    sizes = re.search(r"batch sizes \{'1': (\d+), '2': (\d+), '3': (\d+)\}", ran["asgd.py"])
    assert sizes and int(sizes[3]) < min(int(sizes[1]), int(sizes[2])), ran["asgd.py"]
    # hbsgd.py: averaging the models every 8 steps sends fewer bytes across nodes
    mib = {int(k): int(v) for k, v in re.findall(r"K = (\d+): .* (\d+) MiB", ran["hbsgd.py"])}
    assert mib[8] < mib[1], ran["hbsgd.py"]
    centres = re.findall(r"(\S+): centre ([\d.]+)%", ran["easgd.py"])
    assert [s for s, _ in centres] == ["easgd-rr", "easgd-async", "measgd-async",
                                       "easgd-hogwild", "easgd-sync"]
    assert all(float(acc) > 50 for _, acc in centres), ran["easgd.py"]
    assert percentages(ran["hsgd.py"].splitlines()[-1])[0] > 0.2, ran["hsgd.py"]
