"""The CUDA kernels' source, compiled for the host by g++, against the NumPy references.

A GPU runs each body once per output element ``i``; here a loop over ``i`` does, on the
same text (``minidp.kernels.cuda.KERNELS``), with ``raw`` arrays as flat C arrays as
CuPy's ``CArray`` indexes them. So the index arithmetic of every kernel is checked on
any machine with a C++ compiler; ``tests/gpu/test_cuda_kernels.py`` checks the compiled
CUDA on a device.
"""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from kernel_cases import CONV_CASES, DTYPES, POOL_CASES, rand

from minidp.kernels import cuda
from minidp.kernels import elementwise as ew
from minidp.kernels import pooling as pl
from minidp.kernels import unfold as ic

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
C_TYPES = {"int32": ("int", ctypes.c_int), "int64": ("long long", ctypes.c_longlong),
           "float64": ("double", ctypes.c_double), "bool": ("bool", ctypes.c_bool)}
HEADER = """
#include <algorithm>
using std::min;
template <typename U> struct CArray {
    U* p;
    U& operator[](long long i) const { return p[i]; }
};
"""


def host_function(name, inputs, outputs, body, t):
    """C++ of one kernel for element type ``t``, and the ctypes of its parameters."""
    params, lines, argtypes = [], [], []
    for decl in [d.split() for d in inputs.split(",")]:
        if decl[0] == "raw":
            kind = t if decl[1] == "T" else C_TYPES[decl[1]][0]
            params.append(f"{kind}* p_{decl[2]}")
            lines.append(f"CArray<{kind}> {decl[2]}{{p_{decl[2]}}};")
            argtypes.append(ctypes.c_void_p)
        elif decl[0] == "T":
            params.append(f"const {t}* p_{decl[1]}")
            lines.append(f"#define {decl[1]} p_{decl[1]}[i]")
            argtypes.append(ctypes.c_void_p)
        else:
            params.append(f"{C_TYPES[decl[0]][0]} {decl[1]}")
            argtypes.append(C_TYPES[decl[0]][1])
    refs = []
    for kind, var in [d.split() for d in outputs.split(",")]:
        kind = t if kind == "T" else C_TYPES[kind][0]
        params.append(f"{kind}* p_{var}")
        refs.append(f"{kind}& {var} = p_{var}[i];")
        argtypes.append(ctypes.c_void_p)
    undefs = "\n".join(f"#undef {line.split()[1]}" for line in lines if line.startswith("#"))
    source = "\n".join([f'extern "C" void {name}_{t}({", ".join(params)}, long long n) {{',
                        f"typedef {t} T;", *[x for x in lines if not x.startswith("#")],
                        *[x for x in lines if x.startswith("#")],
                        "for (long long i = 0; i < n; ++i) {", *refs, body, "}", undefs, "}"])
    return source, argtypes + [ctypes.c_longlong]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Every kernel for float and double, compiled into one shared library."""
    parts, signatures = [HEADER], {}
    for name, (inputs, outputs, body) in cuda.KERNELS.items():
        for t in ("float", "double"):
            source, argtypes = host_function(name, inputs, outputs, body, t)
            parts.append(source)
            signatures[f"{name}_{t}"] = argtypes
    folder = tmp_path_factory.mktemp("cuda_host")
    (folder / "kernels.cpp").write_text("\n".join(parts))
    subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-o", str(folder / "kernels.so"),
                    str(folder / "kernels.cpp")], check=True, capture_output=True)
    library = ctypes.CDLL(str(folder / "kernels.so"))
    for name, argtypes in signatures.items():
        getattr(library, name).argtypes = argtypes
    return library


def run(library, name, dtype, *args):
    """Call kernel ``name`` for ``dtype``: arrays by pointer, the last array's size is n."""
    t = "float" if dtype == np.float32 else "double"
    values = [a.ctypes.data if isinstance(a, np.ndarray) else a for a in args]
    getattr(library, f"{name}_{t}")(*values, args[-1].size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_and_col2im_sources_equal_the_references(kernels, dtype, case):
    n, c, h, w, kh, kw, s, ph, pw = case
    oh, ow = ic.output_size(h, kh, s, ph), ic.output_size(w, kw, s, pw)
    x = rand((n, c, h, w), dtype)
    cols = np.full((c * kh * kw, n * oh * ow), np.nan, dtype)
    run(kernels, "im2col", dtype, x, n, c, h, w, kh, kw, s, ph, pw, oh, ow, cols)
    np.testing.assert_array_equal(cols, ic.im2col_reference(x, kh, kw, s, ph, pw))
    g = rand(cols.shape, dtype, 1)
    dx = np.full(x.shape, np.nan, dtype)
    run(kernels, "col2im", dtype, g, n, c, h, w, kh, kw, s, ph, pw, oh, ow, dx)
    np.testing.assert_array_equal(dx, ic.col2im_reference(g, x.shape, kh, kw, s, ph, pw))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pooling_sources_equal_the_references_ties_included(kernels, dtype, case):
    n, c, h, w, k, s = case
    oh, ow = ic.output_size(h, k, s, 0), ic.output_size(w, k, s, 0)
    x = np.round(rand((n, c, h, w), dtype) * 2)
    out, argmax = np.empty((n, c, oh, ow), dtype), np.empty((n, c, oh, ow), np.int64)
    run(kernels, "maxpool_forward", dtype, x, h, w, k, s, oh, ow, out, argmax)
    ref_out, ref_argmax = pl.maxpool_forward_reference(x, k, s)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(argmax, ref_argmax)
    g = rand(out.shape, dtype, 2)
    dx = np.full(x.shape, np.nan, dtype)
    run(kernels, "maxpool_backward", dtype, g, argmax, h, w, k, s, oh, ow, dx)
    np.testing.assert_array_equal(dx, pl.maxpool_backward_reference(g, ref_argmax, x.shape))


@pytest.mark.parametrize("momentum, weight_decay, nesterov",
                         [(0.0, 0.0, False), (0.9, 1e-4, False), (0.9, 5e-4, True)])
def test_the_sgd_source_equals_the_numba_kernel(kernels, momentum, weight_decay, nesterov):
    w, g, buf = (rand(1001, np.float64, seed) for seed in (3, 4, 5))
    w2, buf2 = w.copy(), buf.copy()
    for _ in range(3):
        run(kernels, "sgd_update", np.float64, g, 0.05, momentum, weight_decay, nesterov,
            w, buf)
        ew._sgd_update_kernel(w2, g, buf2, 0.05, momentum, weight_decay, nesterov)
    np.testing.assert_array_equal(w, w2)
    np.testing.assert_array_equal(buf, buf2)
