"""Fuzzing every reader of outside input: every input loads or raises minidp's own error.

The .mdp, IDX and CIFAR-10 readers get mutated valid files, made-up headers and byte
soup; the configuration gets made-up TOML files and ``--set`` items. An input either
loads, or raises ValueError (TypeError for a value of the wrong type in the
configuration) whose message names the file or the setting: never struct.error,
IndexError, UnicodeDecodeError, MemoryError or anything else.

Two Hypothesis profiles: ``quick`` (the default, part of ``make test``: a few seconds)
and ``long`` (``make fuzz``, ``HYPOTHESIS_PROFILE=long``); docs/reliability.md gives
their example counts. No example database is written: runs do not depend on earlier ones.
"""

import argparse
import gzip
import json
import os
import re
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_datasets import cifar_batch, py2_pickle

from minidp import strategies
from minidp.io import mdp
from minidp.io.cifar import load_cifar_batch
from minidp.io.idx import read_idx, write_idx
from minidp.run.config import FIELDS
from minidp.run.errors import UsageError
from minidp.run.flags import from_args, parse_set

settings.register_profile("quick", max_examples=100, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=10000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def refused_alike(load, path):
    """``load(path)``, or a ValueError naming ``path``: nothing else may escape."""
    try:
        load(path)
    except ValueError as exc:
        # not UnicodeDecodeError and the like
        assert type(exc) in (ValueError, mdp.OldVersion), repr(exc)
        assert f"'{path}'" in str(exc), str(exc)
        event("refused")  # --hypothesis-show-statistics counts the outcomes
    else:
        event("loaded")


def mutated(original):
    """A valid file's bytes with bytes replaced, then cut or extended."""
    changes = st.lists(st.tuples(st.integers(0, len(original) - 1), st.integers(0, 255)),
                       max_size=6)
    ends = st.one_of(st.just(len(original)), st.integers(0, len(original) + 8))

    def apply(edits):
        changed, end = bytearray(original), edits[1]
        for offset, value in edits[0]:
            changed[offset] = value
        return bytes(changed[:end] + bytes(max(0, end - len(changed))))
    return st.tuples(changes, ends).map(apply)


# -- .mdp ---------------------------------------------------------------------------------

def written(write):
    """The bytes that ``write(path)`` puts in a file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "file")
        write(path)
        with open(path, "rb") as f:
            return f.read()


RNG = np.random.default_rng(0)
MDP = written(lambda path: mdp.write_mdp(path, RNG.integers(0, 256, (5, 2, 3), dtype=np.uint8),
                                         RNG.integers(0, 4, 5), 4))
DTYPES = st.one_of(st.sampled_from([b"|u1", b"<f4", b"<i8", b"|b1", b"<c8", b"|O8", b"<U4",
                                    b"i4,i4", b"(2)u1", b"<f3", b"|V8", b"<M8"]),
                   st.binary(max_size=8))
DIM = st.one_of(st.integers(0, 8), st.integers(0, 2 ** 32 - 1))


@st.composite
def mdp_headers(draw):
    """Made-up headers (every field drawn) followed by a payload of any length."""
    dims = [draw(DIM) for _ in range(4)]
    fields = (mdp.MAGIC, mdp.VERSION, mdp.HEADER_SIZE,
              draw(st.one_of(st.integers(0, 8), st.integers(0, 2 ** 64 - 1))),
              draw(st.one_of(st.integers(0, 64), st.integers(0, 2 ** 64 - 1))),
              draw(st.integers(0, 6)), *dims, draw(DTYPES), draw(DTYPES),
              draw(st.integers(0, 2 ** 32 - 1)), draw(st.integers(0, 2 ** 64 - 1)),
              draw(st.integers(0, 2 ** 64 - 1)), draw(st.sampled_from([0, 1, 2])),
              draw(st.integers(0, 2 ** 32 - 1)))
    header = struct.pack("<8sIIQQI4I8s8sIQQII32x", *fields)
    if draw(st.booleans()):  # sealed: the fields themselves are checked, not only the CRC
        header = mdp.seal(header)
    return header + draw(st.binary(max_size=200))


def resealed(contents):
    """Files whose header, whatever it says now, carries its right checksum."""
    return contents.map(lambda c: mdp.seal(c[:mdp.HEADER_SIZE]) + c[mdp.HEADER_SIZE:]
                        if len(c) >= mdp.HEADER_SIZE else c)


@given(st.one_of(mutated(MDP), resealed(mutated(MDP)), mdp_headers(), st.binary(max_size=300)))
def test_mdp_reader(where, content):
    path = str(where / "fuzz.mdp")
    with open(path, "wb") as f:
        f.write(content)
    refused_alike(mdp.read_mdp, path)


# -- IDX ----------------------------------------------------------------------------------

IDX = written(lambda path: write_idx(path, np.arange(24, dtype=np.uint8).reshape(2, 3, 4)))


@st.composite
def idx_headers(draw):
    ndim = draw(st.integers(0, 6))
    dims = [draw(DIM) for _ in range(ndim)]
    head = bytes([0, 0, draw(st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x07])),
                  ndim])
    return head + struct.pack(f">{ndim}I", *dims) + draw(st.binary(max_size=100))


@given(st.one_of(mutated(IDX), idx_headers(), st.binary(max_size=100)), st.booleans())
def test_idx_reader(where, content, compressed):
    path = str(where / ("fuzz.gz" if compressed else "fuzz"))
    if compressed and content[:1] != b"\x1f":  # else: a gzip stream of its own making
        content = gzip.compress(content, mtime=0)
    with open(path, "wb") as f:
        f.write(content)
    refused_alike(read_idx, path)


# -- CIFAR-10 pickles ---------------------------------------------------------------------

BATCH = b"\x80\x02" + py2_pickle(cifar_batch(1, RNG)) + b"."
# The same structure around a tiny array: every byte is an opcode or an argument.
SKELETON = b"\x80\x02" + py2_pickle({b"data": np.zeros((1, 3), np.uint8), b"labels": [3],
                                     b"filenames": [b"a.png"]}) + b"."
OPCODES = st.lists(st.sampled_from(sorted({bytes([b]) for b in SKELETON})), max_size=40)


@given(st.one_of(mutated(BATCH), mutated(SKELETON), OPCODES.map(lambda ops: b"".join(ops)),
                 st.binary(max_size=200).map(lambda b: b"\x80\x02" + b)))
def test_cifar_reader(where, content):
    path = str(where / "fuzz_batch")
    with open(path, "wb") as f:
        f.write(content)
    refused_alike(load_cifar_batch, path)


# -- the configuration --------------------------------------------------------------------

def toml_value(value):
    """A value in TOML (floats as TOML spells inf and nan, strings as JSON escapes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not np.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return json.dumps(value)


# Mostly what a user writes (known names, small numbers, known words), sometimes anything:
# a file of made-up keys only tests the first refusal.
KEYS = st.one_of(st.sampled_from(sorted(FIELDS) + [k.replace("_", "-") for k in FIELDS]),
                 st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=12))
WORDS = st.sampled_from(["sync", "daso", "asgd", "hsgd", "mlp", "lenet5", "synthetic", "mpiio",
                         "memory", "auto", "float64", "cosine", "sgd", "fcfs", "1:2:hang"])
SCALARS = st.one_of(st.integers(0, 8), st.floats(0, 1), st.booleans(), WORDS,
                    st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=12))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
STRATEGIES = st.sampled_from(strategies.names())
OPTIONS = st.sampled_from(sorted({name for s in strategies.names()
                                  for name in strategies.strategy_class(s).options}))


# A value of each setting's own type, so that whole files load and reach the range checks.
TYPED = {"int": st.integers(0, 8), "float": st.floats(0, 2), "bool": st.booleans(),
         "str": WORDS}
SETTINGS = {name: TYPED[str(f.type).removesuffix(" | None")] for name, f in FIELDS.items()
            if name != "options"}


@st.composite
def toml_files(draw):
    """Top-level settings, then one strategy table (or another table), as TOML text."""
    typed = draw(st.dictionaries(st.sampled_from(sorted(SETTINGS)), st.just(None), max_size=4))
    chosen = {k: draw(SETTINGS[k]) for k in typed}
    chosen.update(draw(st.dictionaries(KEYS, VALUES, max_size=2)))
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in chosen.items()]
    if draw(st.booleans()):
        table = draw(st.one_of(STRATEGIES, KEYS))
        lines.append(f"[{json.dumps(table)}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}"
                  for k, v in draw(st.dictionaries(st.one_of(OPTIONS, KEYS), VALUES,
                                                   max_size=3)).items()]
    return "\n".join(lines) + "\n"


@st.composite
def set_items(draw, strategy):
    """``--set`` items: mostly options of ``strategy`` with a plausible value, or any text."""
    own = sorted(strategies.strategy_class(strategy).options) or ["none"]
    item = st.tuples(st.one_of(st.just(strategy), STRATEGIES),
                     st.one_of(st.sampled_from(own), OPTIONS),
                     SCALARS.map(lambda v: str(v).lower() if isinstance(v, bool) else str(v)))
    return draw(st.lists(st.one_of(item.map(lambda t: f"{t[0]}.{t[1]}={t[2]}"),
                                   st.text(max_size=20)), max_size=3))


# An error names what it is about: a flag, --config, --set, a strategy's option, a strategy.
NAMED = re.compile(r"(--[a-z-]+|[a-z-]+\.[A-Za-z0-9_]+:|strategy '[^']*': unknown option)")


@given(st.one_of(toml_files(), st.binary(max_size=80)))
def test_toml_config(where, content):
    path = where / "fuzz.toml"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    try:
        from_args(argparse.Namespace(config=str(path), set=[]))
    except (ValueError, TypeError) as exc:
        assert type(exc) in (ValueError, TypeError, UsageError), repr(exc)
        assert NAMED.search(str(exc)), str(exc)
        event("refused")
    else:
        event("loaded")


@given(st.data())
def test_set_items(data):
    strategy = data.draw(STRATEGIES)
    items = data.draw(set_items(strategy))
    try:
        options = parse_set(items, strategy)
        from_args(argparse.Namespace(strategy=strategy, set=items))
    except (ValueError, TypeError) as exc:
        assert type(exc) in (ValueError, TypeError, UsageError), repr(exc)
        assert NAMED.search(str(exc)), str(exc)
        event("refused")
    else:
        assert set(options) <= set(strategies.strategy_class(strategy).options)
        event("loaded")
