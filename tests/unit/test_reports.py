"""`minidp report`: run directories read back, runs named by what differs, report and plots."""

import argparse
import itertools
import json
import os
import subprocess
import sys

import pytest

from minidp.__main__ import main
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


def report_command(args, timeout=120):
    """``python -m minidp report ARGS`` in its own process (a FIFO must not hang the suite)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "minidp", "report", *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


ROW = {"epoch": 1, "train_loss": 1.0, "test_loss": 1.5, "test_accuracy": 0.5, "wall_s": 2.0,
       "comm_s": 0.5, "phases": PHASES}


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "line 2: got [1, 2] (an array), allowed: a JSON object, as minidp writes it"),
    ('{"epoch": 2}', "line 2: no 'train_loss', allowed: a record that has it (a finite "
                     "number, or null (a diverged epoch)), as minidp writes it"),
    (json.dumps({**ROW, "epoch": 2, "wall_s": "2.0"}),
     "line 2: 'wall_s' is \"2.0\" (a string), allowed: a finite number >= 0"),
    (json.dumps({**ROW, "epoch": "2"}),
     "line 2: 'epoch' is \"2\" (a string), allowed: an int >= 1"),
    (json.dumps({**ROW, "epoch": 2, "test_accuracy": 7}),
     "line 2: 'test_accuracy' is 7 (int), allowed: a number in [0, 1]"),
    (json.dumps({**ROW, "epoch": 2, "phases": {"forward": -1}}),
     "line 2: 'phases' is {\"forward\": -1} (an object), allowed: a JSON object of finite "
     "numbers >= 0"),
    (json.dumps({**ROW, "epoch": 2, "strategy": {"staleness_histogram": [1, "x"]}}),
     "line 2, 'strategy': 'staleness_histogram' is [1, \"x\"] (an array), allowed: an array "
     "of ints >= 0"),
    ('{"epoch": 2, ', "line 2: not valid JSON at character 15 (Expecting property name "
                      "enclosed in double quotes)"),
], ids=["array", "missing", "string", "epoch", "accuracy", "phases", "stats", "json"])
def test_a_malformed_metrics_row_is_one_line_naming_file_line_and_field(tmp_path, capsys,
                                                                      line, message):
    run = make_run(tmp_path / "a", "sync", [0.5])
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write(line + "\n")
    out = tmp_path / "report"
    assert main(["report", run, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: report: metrics.jsonl: '{run}/metrics.jsonl', {message}\n"
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("name, content, message", [
    ("run.json", "[]", "run.json: '{run}/run.json': got [] (an array), allowed: a JSON object"),
    ("run.json", '{"config": {"strategy": 3}}',
     "run.json: '{run}/run.json', 'config': 'strategy' is 3 (int), allowed: a string"),
    ("summary.json", '{"world_size": 4}',
     "summary.json: '{run}/summary.json': no 'wall_s', allowed: a record that has it"),
    ("summary.json", '{"world_size": 4, "wall_s": 1, "bytes_sent": {"intra": "many"}}',
     "summary.json: '{run}/summary.json': 'bytes_sent' is {\"intra\": \"many\"} (an object), "
     "allowed: a JSON object of byte counts >= 0"),
    ("trace.json", '{"traceEvents": [{"name": "forward", "ph": "X", "pid": 0}]}',
     "trace.json: '{run}/trace.json', event 0: no 'dur', allowed: a record that has it"),
    ("trace.json", '{"traceEvents": 5}',
     "trace.json: '{run}/trace.json' holds no list of events"),
    ("metrics.jsonl", b"\xff\xfe\n", "metrics.jsonl: '{run}/metrics.jsonl' is not UTF-8 text"),
], ids=["run-array", "strategy", "summary", "bytes", "trace-event", "trace-list", "bytes-utf8"])
def test_other_files_that_are_not_minidps_are_named(tmp_path, capsys, name, content, message):
    run = make_run(tmp_path / "a", "sync", [0.5])
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(os.path.join(run, name), mode) as f:
        f.write(content)
    assert main(["report", run, "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: report: " + message.replace("{run}", run)), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", ["run.json", "metrics.jsonl", "summary.json", "trace.json"])
def test_a_fifo_in_a_run_directory_is_refused_not_waited_on(tmp_path, name):
    run = make_run(tmp_path / "a", "sync", [0.5])
    os.remove(os.path.join(run, name))
    os.mkfifo(os.path.join(run, name))  # opened for reading, it waits for a writer for ever
    status, output = report_command([run, "--out", str(tmp_path / "report")])
    assert status == 2, output
    assert output == (f"error: report: {name}: '{run}/{name}' is a FIFO (named pipe), not a "
                      "regular file (minidp writes regular files there)\n")


def test_a_device_behind_a_link_is_refused(tmp_path, capsys):
    run = make_run(tmp_path / "a", "sync", [0.5])
    os.remove(os.path.join(run, "trace.json"))
    os.symlink("/dev/zero", os.path.join(run, "trace.json"))  # it never ends
    assert main(["report", run, "--out", str(tmp_path / "report")]) == 2
    assert capsys.readouterr().err == (f"error: report: trace.json: '{run}/trace.json' is a "
                                       "device, not a regular file (minidp writes regular files "
                                       "there)\n")


def test_an_out_that_is_no_directory_is_one_line(tmp_path, capsys):
    run = make_run(tmp_path / "a", "sync", [0.5])
    taken = tmp_path / "taken"
    taken.write_text("a user's file\n")
    assert main(["report", run, "--out", str(taken)]) == 2
    assert capsys.readouterr().err == (f"error: report: --out: '{taken}' is a regular file, "
                                       "allowed: a directory, new or existing, for report.md "
                                       "and the plots\n")
    assert taken.read_text() == "a user's file\n"
    assert main(["report", run, "--out", str(taken / "sub")]) == 2  # cannot be made
    assert capsys.readouterr().err == (f"error: report: --out: cannot write '{taken}/sub': "
                                       "Not a directory\n")
