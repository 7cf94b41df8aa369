"""`minidp report`: run directories read back, runs named by what differs, report and plots."""

import argparse
import itertools
import json
import os

import pytest

from minidp.reporting import report
from minidp.reporting.runs import label_runs, load_run

pytest.importorskip("matplotlib")
from minidp.reporting import plots  # noqa: E402 (needs matplotlib)

PHASES = {"data": 0.1, "forward": 1.0, "backward": 2.0, "comm_intra": 0.5,
          "comm_inter": 0.25, "wait": 0.25, "optimizer": 0.1}


def make_run(path, strategy, epochs, options=None, finished=True, slowdown=None, stats=None,
             **settings):
    """A run directory as `minidp train --out` writes it (the fields the report reads)."""
    os.makedirs(path)
    config = {"model": "lenet5", "dataset": "fashion-mnist", "strategy": strategy,
              "epochs": len(epochs), "batch_size": 64, "lr": 0.05, "out": str(path),
              "slowdown": slowdown, "options": options or {}, **settings}
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


SIX = [  # (strategy, settings) of six runs that differ in settings, as `minidp train` records
    ("sync", {}),
    ("sync", {"net_latency_us": 50.0, "net_bandwidth_gbps": 1.0, "ranks_per_node": 2}),
    ("hsgd", {"ranks_per_node": 2, "net_latency_us": 0.0, "net_bandwidth_gbps": 0.0}),
    ("daso", {"ranks_per_node": 2, "options": {"warmup_epochs": 1, "cooldown_epochs": 1}}),
    ("asgd", {"slowdown": "3:3"}),
    ("dbs", {"lr": 0.05})]


# The strategies' default (lr, momentum), docs/configuration.md's table written out.
RATES = {"sync": (0.02, 0.9), "hsgd": (0.02, 0.9), "daso": (0.02, 0.9), "asgd": (0.02, 0.0),
         "dbs": (0.02, 0.0)}


def six_runs(tmp_path):
    paths = []
    for k, (strategy, settings) in enumerate(SIX):
        lr, momentum = RATES[strategy]  # what a run records: its strategy's default rates
        settings = {"lr": lr, "momentum": momentum, "net_latency_us": 0.0,
                    "net_bandwidth_gbps": 0.0, **settings}
        paths.append(make_run(tmp_path / f"r{k}", strategy,
                              [0.5 + 0.01 * k, 0.6, 0.7 - 0.01 * k], **settings))
    return [load_run(p) for p in paths]


def test_six_runs_of_different_settings_get_short_labels_of_what_differs(tmp_path):
    runs = six_runs(tmp_path)
    label_runs(runs)
    # rates at the strategy's default and settings at their default are not named
    assert [r.label for r in runs] == [
        "sync", "sync (1 Gb/s, 50 us, 2 per node)", "hsgd (2 per node)",
        "daso (cooldown_epochs=1, warmup_epochs=1, 2 per node)", "asgd (slowdown 3:3)",
        "dbs (lr 0.05)"]


def drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def overlap(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_stand_outside_every_axes_and_panel_titles_fit(tmp_path):
    runs = six_runs(tmp_path)
    label_runs(runs)
    for make in (plots.accuracy, plots.loss, plots.phases_per_epoch, plots.phases_per_rank,
                 plots.bytes_per_level):
        fig = make(runs)
        renderer = drawn(fig)
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        assert len(legends) == 1, make.__name__
        box = legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            if ax.get_visible():
                assert not overlap(box, ax.get_window_extent(renderer)), make.__name__
        titles = [ax.title.get_window_extent(renderer) for ax in fig.axes
                  if ax.get_visible() and ax.get_title()]
        for a, b in itertools.combinations(titles, 2):
            assert not overlap(a, b), make.__name__
        plots.plt.close(fig)
    assert len(plots.loss(runs).axes[0].get_legend().get_texts()) == 6 + 2  # runs, styles
    # a long label wraps over lines inside its own panel
    runs[3].label = "daso (cooldown_epochs=1, warmup_epochs=1, 2 per node, batch 128, lr 0.1)"
    fig = plots.phases_per_epoch(runs)
    renderer = drawn(fig)
    title, panel = fig.axes[3].title, fig.axes[3].get_window_extent(renderer)
    assert title.get_text().count("\n") >= 1
    box = title.get_window_extent(renderer)
    assert panel.x0 - 10 <= box.x0 and box.x1 <= panel.x1 + 10


def test_report_of_one_run_that_finished_no_epoch_has_no_plots(tmp_path):
    run = make_run(tmp_path / "a", "sync", [], finished=False)
    out = tmp_path / "report"
    assert report.run(args_for([run], out)) == 0
    text = (out / "report.md").read_text()
    assert "| sync | - | 0 (unfinished) | - |" in text
    assert "No plots: no run has finished an epoch yet." in text
    assert sorted(os.listdir(out)) == ["report.md"]
    one = make_run(tmp_path / "b", "sync", [0.5, 0.6], finished=False)
    assert report.run(args_for([one], tmp_path / "report2")) == 0
    assert {"accuracy.png", "loss.png", "phases.png"} <= set(os.listdir(tmp_path / "report2"))


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


def test_a_diverged_epoch_with_null_losses_is_reported_as_nan(tmp_path):
    run = make_run(tmp_path / "a", "sync", [0.5, 0.1])
    metrics = os.path.join(run, "metrics.jsonl")
    epochs = [json.loads(line) for line in open(metrics)]
    epochs[-1].update(train_loss=None, test_loss=None)  # as strict JSON writes NaN
    with open(metrics, "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in epochs)
    out = tmp_path / "report"
    assert report.run(args_for([run], out)) == 0
    assert "| 2 | nan | nan | 10.00% |" in (out / "report.md").read_text()
    assert (out / "loss.png").exists()


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="RUN_DIR: .* has no run.json and metrics.jsonl"):
        load_run(str(tmp_path))
    with pytest.raises(ValueError, match="RUN_DIR: got .*nowhere"):
        load_run(str(tmp_path / "nowhere"))
