"""`minidp compare`: flags checked before any launch, options routed, one job per strategy."""

import json
import os
import subprocess
import sys

import pytest
from spmd import ROOT

from minidp.reporting import compare

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
    with pytest.raises(ValueError, match="got 'daso:rail', allowed: daso:OPTION=VALUE"):
        compare.strategies_of("daso:rail")
    with pytest.raises(ValueError, match="--out is set by compare"):
        compare.check_train_flags([("sync", [])], ["--out", "x"])
    with pytest.raises(ValueError, match="--lr"):
        compare.check_train_flags([("sync", []), ("hsgd", [])], ["--lr", "-1"])
    with pytest.raises(ValueError, match="daso.global_sync: got 'ring', allowed: 'all' or"):
        compare.check_train_flags(compare.strategies_of("daso:global_sync=ring"), [])


def test_a_variant_is_a_strategy_with_its_own_options():
    variants = compare.strategies_of("sync, daso:global_sync=rail:downcast=bf16")
    assert variants == [("sync", []), ("daso", ["--set", "daso.global_sync=rail",
                                                "--set", "daso.downcast=bf16"])]
    assert compare.job_name(*variants[1]) == "daso-global_sync=rail-downcast=bf16"


def test_compare_trains_each_strategy_and_reports_them(tmp_path, synthetic_data_dir):
    out = tmp_path / "cmp"
    command = [sys.executable, "-m", "minidp", "compare", "--strategies",
               "sync,daso:global_sync=rail",
               "--ranks", "2", "--out", str(out), "--", "--model", "mlp",
               "--dataset", "synthetic", "--data-dir", synthetic_data_dir, "--epochs", "2",
               "--train-samples", "512", "--test-samples", "256", "--batch-size", "32",
               "--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=0"]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(os.listdir(out))
    assert runs[:2] == ["01-sync", "02-daso-global_sync=rail"]
    daso_config = json.load(open(out / "02-daso-global_sync=rail" / "run.json"))["config"]
    assert daso_config["options"]["warmup_epochs"] == 1
    assert daso_config["options"]["global_sync"] == "rail"
    text = (out / "report.md").read_text()
    assert "| sync |" in text
    assert "| daso (cooldown_epochs=0, global_sync=rail, warmup_epochs=1) |" in text
    assert (out / "accuracy.png").exists()
