"""`minidp report`: run directories read back, runs named by what differs, report and plots."""

import argparse
import json
import os

import pytest

from minidp.reporting import report
from minidp.reporting.runs import label_runs, load_run

pytest.importorskip("matplotlib")

PHASES = {"data": 0.1, "forward": 1.0, "backward": 2.0, "comm_intra": 0.5,
          "comm_inter": 0.25, "wait": 0.25, "optimizer": 0.1}


def make_run(path, strategy, epochs, options=None, finished=True, slowdown=None, stats=None):
    """A run directory as `minidp train --out` writes it (the fields the report reads)."""
    os.makedirs(path)
    config = {"model": "lenet5", "dataset": "fashion-mnist", "strategy": strategy,
              "epochs": len(epochs), "batch_size": 64, "lr": 0.05, "out": str(path),
              "slowdown": slowdown, "options": options or {}}
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump({"config": config}, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for k, acc in enumerate(epochs):
            m = {"epoch": k + 1, "train_loss": 1.0 / (k + 1), "test_loss": 1.5 / (k + 1),
                 "test_accuracy": acc, "wall_s": 2.0, "comm_s": 0.5, "phases": PHASES}
            if stats:
                m["strategy"] = stats
            f.write(json.dumps(m) + "\n")
    if finished:
        with open(os.path.join(path, "summary.json"), "w") as f:
            json.dump({"world_size": 4, "wall_s": 2.0 * len(epochs) + 0.5,
                       "bytes_sent": {"intra": 3 * 2**20, "inter": 2**20}}, f)
    events = [{"name": p, "ph": "X", "pid": r, "tid": 0, "ts": 0, "dur": 1e6 * s * (r + 1)}
              for r in range(2) for p, s in PHASES.items()]
    with open(os.path.join(path, "trace.json"), "w") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def args_for(runs, out):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    return parser.parse_args([*runs, "--out", str(out)])


def test_runs_are_named_by_strategy_non_default_options_and_differing_settings(tmp_path):
    sync = make_run(tmp_path / "a", "sync", [0.5, 0.6])
    daso = make_run(tmp_path / "b", "daso", [0.55, 0.65],
                    options={"warmup_epochs": 1, "max_global_skips": 8})  # 8 is the default
    slow = make_run(tmp_path / "c", "sync", [0.4, 0.5], slowdown="3:3")
    runs = [load_run(p) for p in (sync, daso, slow)]
    label_runs(runs)
    assert [r.label for r in runs] == ["sync", "daso (warmup_epochs=1)",
                                       "sync (slowdown 3:3)"]


def test_repeated_runs_are_numbered(tmp_path):
    runs = [load_run(make_run(tmp_path / n, "sync", [0.5])) for n in "ab"]
    label_runs(runs)
    assert [r.label for r in runs] == ["sync", "sync #2"]


def test_rank_phases_sum_the_trace_per_rank(tmp_path):
    run = load_run(make_run(tmp_path / "a", "sync", [0.5]))
    assert run.rank_phases[0]["backward"] == pytest.approx(2.0)
    assert run.rank_phases[1]["backward"] == pytest.approx(4.0)


def test_report_writes_the_table_the_plots_and_every_epoch(tmp_path):
    sync = make_run(tmp_path / "a", "sync", [0.5, 0.6])
    asgd = make_run(tmp_path / "b", "asgd", [0.45, 0.7], finished=False,
                    stats={"staleness_histogram": [1, 5, 2] + [0] * 30})
    out = tmp_path / "report"
    assert report.run(args_for([sync, asgd], out)) == 0
    text = (out / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| sync |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # ranks, epochs, final, best, training s (the summary's), s/epoch, comm share, MiB
    assert cells[1:10] == ["4", "2", "60.00%", "60.00%", "4.5", "2.00", "25%", "3", "1"]
    assert "| asgd | - | 2 (unfinished) | 70.00% | 70.00% | 4.0 |" in text
    for name in ("accuracy.png", "loss.png", "phases.png", "ranks.png", "bytes.png",
                 "staleness.png"):
        assert f"]({name})" in text
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "daso.png").exists()  # no DASO run: no schedule plot
    assert text.count("| 2 | 0.5000 | 0.7500 |") == 2  # every run's epoch 2 row


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="RUN_DIR: .* has no run.json and metrics.jsonl"):
        load_run(str(tmp_path))
    with pytest.raises(ValueError, match="RUN_DIR: got .*nowhere"):
        load_run(str(tmp_path / "nowhere"))
