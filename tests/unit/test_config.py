"""The training configuration: flags, TOML, --set, precedence and checks."""

import argparse
import re

import pytest

from minidp.run.config import TrainConfig
from minidp.run.flags import build_parser, from_args


def parse(argv):
    return from_args(build_parser(argparse.ArgumentParser()).parse_args(argv))


def test_defaults_flags_and_set():
    c = parse(["--strategy", "daso", "--epochs", "3", "--set", "daso.max_global_skips=4"])
    assert (c.strategy, c.epochs, c.lr, c.reader) == ("daso", 3, 0.02, "mpiio")
    assert c.options["max_global_skips"] == 4 and c.options["warmup_epochs"] == 4
    assert c.per_worker_batch(4) == 32


def test_toml_file_with_flags_overriding(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('strategy = "hbsgd"\nbatch-size = 32\nepochs = 7\n[hbsgd]\nk = 8\n')
    c = parse(["--config", str(path), "--epochs", "2"])
    assert (c.strategy, c.batch_size, c.epochs, c.options) == ("hbsgd", 32, 2, {"k": 8})
    c = parse(["--config", str(path), "--set", "hbsgd.k=2"])
    assert c.options == {"k": 2}


@pytest.mark.parametrize("text, message", [
    ("epochz = 3\n", "unknown setting 'epochz'; valid settings: allreduce, batch-size"),
    ('nesterov = "false"\n', "nesterov: got 'false' (str), allowed: a bool (true or false)"),
    ("batch-size = 32.0\n", "batch-size: got 32.0 (float), allowed: an int or unset"),
    ("epochs = true\n", "epochs: got True (bool), allowed: an int"),
    ('lr = "0.1"\n', "lr: got '0.1' (str), allowed: a number"),
    ("net_latency_us = inf\n", "--net-latency-us: got inf, allowed: a finite number in [0, "
                               "1e+06] (microseconds per message)"),
    ("batch_size = 8\nbatch-size = 16\n", "'batch_size' and 'batch-size' are the same setting; "
                                          "give it once"),
    ('resume = true\n', "resume: got True (bool), allowed: a string"),
    ("[daso]\nk = 1\n", "table [daso] holds options of 'daso', but the strategy is 'sync'"),
    ("[nope]\nk = 1\n", "table [nope]: strategy: got 'nope', allowed: sync, hsgd, hbsgd, daso"),
    (b"lr = '\xff'\n", "not valid TOML: 'utf-8' codec can't decode byte 0xff"),
    ("epochs = \n", "not valid TOML"),
])
def test_bad_toml(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        parse(["--config", str(path)])


@pytest.mark.parametrize("argv, message", [
    (["--set", "daso.k"], "--set: got 'daso.k', allowed: STRATEGY.OPTION=VALUE"),
    (["--set", "daso.k=1"], "--set: 'daso.k=1' is an option of 'daso', but --strategy is 'sync'"),
    (["--model", "vgg"], "--model: got 'vgg', allowed: mlp, lenet5, cifar_cnn, resnet20"),
    (["--epochs", "0"], "--epochs: got 0, allowed: an int >= 1"),
    (["--momentum", "1.5"], r"--momentum: got 1.5, allowed: a number in \[0, 1\)"),
    (["--net-latency-us", "inf"], r"--net-latency-us: got inf, allowed: a finite number in \[0, "),
    (["--net-latency-us", "1e308"], r"--net-latency-us: got 1e\+308, allowed: a finite number "
                                    r"in \[0, 1e\+06\] \(microseconds per message\)"),
    (["--net-bandwidth-gbps", "1e-300"], r"--net-bandwidth-gbps: got 1e-300, allowed: 0 "
                                         r"\(unlimited\) or a finite number in \[0.001, 1e\+06\]"),
    (["--slowdown", "0:1e308"], r"--slowdown: got '0:1e308', allowed: RANK:FACTOR with RANK an "
                                r"int >= 0 and FACTOR a number in \[1, 1000\]"),
    (["--comm-timeout", "1e-9"], "--comm-timeout: got 1e-09, allowed: a finite number of "
                                 "seconds >= 1"),
    (["--lr", "nan"], "--lr: got nan, allowed: a finite number > 0"),
    (["--comm-timeout", "inf"], "--comm-timeout: got inf, allowed: a finite number of seconds"),
    (["--strategy", "daso", "--set", "daso.staleness_weight=inf"],
     "daso.staleness_weight: got inf, allowed: a finite number, a float > 0"),
    (["--resume", "maybe"], "--resume: got 'maybe', allowed: --resume alone"),
    (["--resume", "--overwrite"], "--overwrite and --resume: give one of them, not both"),
    (["--stop-after", "1"], "--stop-after 1: allowed only with --checkpoint-every N"),
    (["--batch-size", "8", "--global-batch-size", "32"], "give one of them, not both"),
    (["--reader", "fast"], "--reader: got 'fast', allowed: memory, mpiio, leader, strided"),
])
def test_bad_flags(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(argv)


def test_global_batch_is_split_over_workers():
    assert TrainConfig(global_batch_size=256).check().per_worker_batch(4) == 64
    with pytest.raises(ValueError, match="--global-batch-size: got 6, allowed: a multiple of "
                                         "the 4 workers"):
        TrainConfig(global_batch_size=6).per_worker_batch(4)


def test_one_type_check_for_toml_and_code(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("lr = 1\nnesterov = true\nresume = \"auto\"\n")
    c = parse(["--config", str(path)])
    assert (c.lr, type(c.lr), c.nesterov, c.resume, c.out) == (1.0, float, True, "auto", None)
    with pytest.raises(TypeError, match="--seed: got 1.5 \\(float\\), allowed: an int"):
        TrainConfig(seed=1.5).check()
    with pytest.raises(TypeError, match="--nesterov: got 'no' \\(str\\), allowed: a bool"):
        TrainConfig(nesterov="no").check()


def test_no_verify_flag_and_toml_key(tmp_path):
    assert (parse([]).verify, parse(["--no-verify"]).verify) == (True, False)
    path = tmp_path / "run.toml"
    path.write_text("verify = false\n")
    assert parse(["--config", str(path)]).verify is False


def test_resume_flag_values():
    assert [parse(a).resume for a in ([], ["--resume"], ["--resume", "auto"])] == \
        ["no", "yes", "auto"]
    assert parse(["--resume", "--epochs", "3"]).epochs == 3


@pytest.mark.parametrize("path, message", [
    ("/missing.toml", "--config: '/missing.toml' does not exist; allowed: a TOML file of "
                      "settings"),
    ("/dev/zero", "--config: '/dev/zero' is a device, not a regular file; allowed: a TOML file"),
    ("{dir}", "--config: '{dir}' is a directory, not a regular file"),
    ("{fifo}", "--config: '{fifo}' is a FIFO (named pipe), not a regular file"),
    ("{big}", "--config: '{big}' has 1048577 bytes; allowed: a TOML file of settings, at most "
              "1048576 bytes"),
])
def test_a_config_path_that_is_no_settings_file_is_named_before_it_is_read(tmp_path, path,
                                                                            message):
    import os

    where = {"dir": str(tmp_path), "fifo": str(tmp_path / "fifo"), "big": str(tmp_path / "big")}
    os.mkfifo(where["fifo"])  # reading it would wait for a writer for ever
    (tmp_path / "big").write_text("#" * (1 << 20) + "\n")
    with pytest.raises(ValueError, match=re.escape(message.format(**where))):
        parse(["--config", path.format(**where)])


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "0.5", ""])
def test_a_bad_comm_timeout_variable_is_refused(monkeypatch, value):
    from minidp.comm import guard

    monkeypatch.setattr(guard, "_settings", {})
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", value)
    if not value:  # unset (empty): the default
        assert guard.comm_timeout() == 300.0
        return
    with pytest.raises(ValueError, match=re.escape(f"MINIDP_COMM_TIMEOUT: got {value!r}, "
                                                   "allowed: a number of seconds >= 1")):
        guard.comm_timeout()


def test_more_threads_than_cores_is_refused(monkeypatch):
    from minidp import threads

    monkeypatch.setenv("MINIDP_NUM_THREADS", "100000")
    with pytest.raises(ValueError, match=re.escape(
            f"MINIDP_NUM_THREADS: got 100000, allowed: 1 to {threads.available_cores()} (the "
            "cores")):
        threads.check()
    monkeypatch.setenv("MINIDP_NUM_THREADS", str(threads.available_cores()))
    threads.check()


def test_a_warm_up_longer_than_the_run_is_refused_saying_what_it_would_do():
    with pytest.raises(ValueError, match=re.escape(
            "--warmup-epochs: got 10 with --epochs 2, allowed: 0 to 2 (the warm-up raises the "
            "rate linearly to --lr; one longer than the run ends at 20% of it); give --epochs "
            "10 or more, or a shorter warm-up")):
        parse(["--epochs", "2", "--warmup-epochs", "10"])
    # as long as the run: the rate reaches --lr at its last step (examples/hsgd.py, 1 epoch)
    assert parse(["--epochs", "2", "--warmup-epochs", "2"]).warmup_epochs == 2


def test_the_strategy_options_and_network_checks_are_one_function_for_train_and_simulate():
    from minidp.run.config import check_network, strategy_options

    with pytest.raises(ValueError, match=r"daso.staleness_weight: got inf, allowed: a finite"):
        strategy_options("daso", {"staleness_weight": "inf"})
    with pytest.raises(ValueError, match=r"--net-bandwidth-gbps: got 1e-09, allowed: 0 "):
        check_network(0.0, 1e-9)
    check_network(50.0, 1.0)
