"""`minidp compare`: flags checked before any launch, options routed, one job per strategy."""

import json
import os
import subprocess
import sys

import pytest
from spmd import ROOT

from minidp import compare

pytest.importorskip("matplotlib")


def test_a_set_option_goes_only_to_the_strategy_it_names():
    flags = ["--epochs", "2", "--set", "daso.warmup_epochs=1", "--set", "hsgd.lars=1",
             "--lr", "0.1"]
    assert compare.flags_for("daso", flags) == ["--epochs", "2", "--set",
                                                "daso.warmup_epochs=1", "--lr", "0.1"]
    assert compare.flags_for("sync", flags) == ["--epochs", "2", "--lr", "0.1"]


def test_bad_input_is_refused_before_any_job_starts():
    with pytest.raises(ValueError, match="--strategies: got 'snyc', allowed: sync"):
        compare.strategies_of("sync,snyc")
    with pytest.raises(ValueError, match="--out is set by compare"):
        compare.check_train_flags(["sync"], ["--out", "x"])
    with pytest.raises(ValueError, match="--lr"):
        compare.check_train_flags(["sync", "hsgd"], ["--lr", "-1"])


def test_compare_trains_each_strategy_and_reports_them(tmp_path, synthetic_data_dir):
    out = tmp_path / "cmp"
    command = [sys.executable, "-m", "minidp", "compare", "--strategies", "sync,daso",
               "--ranks", "2", "--out", str(out), "--", "--model", "mlp",
               "--dataset", "synthetic", "--data-dir", synthetic_data_dir, "--epochs", "2",
               "--train-samples", "512", "--test-samples", "256", "--batch-size", "32",
               "--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=0"]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(os.listdir(out))
    assert runs[:2] == ["01-sync", "02-daso"]
    daso_config = json.load(open(out / "02-daso" / "run.json"))["config"]
    assert daso_config["options"]["warmup_epochs"] == 1
    text = (out / "report.md").read_text()
    assert "| sync |" in text and "| daso (cooldown_epochs=0, warmup_epochs=1) |" in text
    assert (out / "accuracy.png").exists()
