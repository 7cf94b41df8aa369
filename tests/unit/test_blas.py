"""``python -m minidp info`` names the BLAS's kernels, and says when they are narrower than
the CPU."""

import json
import os
import subprocess
import sys

import pytest

from minidp.kernels.blas import cpu_flags, narrower_than_cpu

AVX512 = frozenset({"avx2", "avx512f"})
AVX2 = frozenset({"avx2"})


@pytest.mark.parametrize("kernels, flags, pinned, says", [
    ("Haswell", AVX512, "Haswell", "OPENBLAS_CORETYPE=Haswell runs OpenBLAS's Haswell"),
    ("Zen", AVX512, "Zen", "OPENBLAS_CORETYPE=Zen runs OpenBLAS's Zen"),
    ("Haswell", AVX512, None, "OpenBLAS chose its Haswell kernels"),
    ("SkylakeX", AVX512, "SkylakeX", None),  # the pinned type has AVX-512
    ("Cooperlake", AVX512, None, None),
    ("SapphireRapids", AVX512, None, None),
    ("Haswell", AVX2, "Haswell", None),  # the CPU has no AVX-512: nothing to gain
    ("Haswell", frozenset(), "Haswell", None),  # flags unknown: nothing claimed
    (None, AVX512, "Haswell", None),  # kernels unknown
])
def test_a_note_only_where_the_kernels_lack_the_avx512_the_cpu_has(kernels, flags, pinned,
                                                                     says):
    note = narrower_than_cpu(kernels, flags, pinned)
    if says is None:
        assert note is None
    else:
        assert note.startswith(says) and "AVX-512" in note


def info(**env):
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    full.update(env)
    out = subprocess.run([sys.executable, "-m", "minidp", "info"], env=full,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["blas"]


def test_info_reports_the_kernels_openblas_runs_and_the_variable_that_pinned_them():
    libraries = info(OPENBLAS_CORETYPE="Haswell")
    if [lib["library"] for lib in libraries] != ["openblas"]:
        pytest.skip(f"NumPy's BLAS here is not OpenBLAS alone: {libraries}")
    (pinned,) = libraries
    # OpenBLAS itself answers: the pin takes effect on every x86-64 CPU with AVX2
    assert (pinned["library"], pinned["kernels"], pinned["pinned_by"]) == \
        ("openblas", "Haswell", "OPENBLAS_CORETYPE=Haswell")
    has_avx512 = "avx512f" in cpu_flags()
    assert ("note" in pinned) == has_avx512, pinned
    (own,) = info()
    assert own["pinned_by"] is None and own["kernels"]
    if has_avx512:  # OpenBLAS 0.3.31 knows the AVX-512 CPUs of this machine's kinds
        assert own["kernels"] in ("SkylakeX", "Cooperlake", "SapphireRapids"), own
