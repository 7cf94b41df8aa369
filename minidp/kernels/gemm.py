"""NumPy's own matrix product, callable from inside a Numba kernel without the GIL.

Why: a convolution's region (:mod:`minidp.kernels.threaded`) on two or more threads is
one parallel Numba kernel, each thread running its chunks (unfold, product, fold) with
no Python and no GIL in between, so the products must be called from inside the kernel.
A chunk as Python around three or four kernel calls, each letting the GIL go and taking
it back, ran slower on two threads than on one where idle cores halt (a virtual machine,
where waking a thread that waited for the GIL costs 50-250 us): LeNet-5's first
convolution's backward took 1.21-1.36 ms on two threads against 0.98-1.01 on one, and
0.66-0.78 ms as one call per chunk with its products inside (docs/benchmarks.md). So on
more than one thread the conv engines call the BLAS from inside their kernels, through
this module (:func:`region_gemm` says when); on one there is no GIL to share, and the
Python steps run, with the same bits.

The product is the ``cblas_?gemm`` of the library NumPy itself calls for ``matmul``
(found by threadpoolctl, the one in NumPy's own directory first), called with the
arguments NumPy's matmul passes for the same operands (row-major; a C-contiguous operand
untransposed, a transposed view transposed), so a kernel's products have the bits of
NumPy's. BLAS's thread count applies as for NumPy's calls (a region runs it on one).
A kernel receives the function as an argument (Numba caches it by its signature, not its
address) and calls it directly: kernels call compiled functions of their own file only
(:mod:`.locator`).

From Python, :func:`add_product` calls the same function with beta = 1: ``out += a @ b``
inside the BLAS, which NumPy's matmul (beta = 0 always) cannot do. A linear layer's
weight gradient is added into the flat gradient buffer this way, instead of a product
into a new array and then a pass of ``+=`` over both.

Each function found is tried once on a small product against NumPy's matmul, bit for
bit. Where none is found or passes (a BLAS with other names), :func:`native` is None and
the engines keep their chunks in Python around the same kernels: the same bits, slower
on threads.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np
from numba.core.typing.ctypes_utils import make_function_type
from numba.core.typing.typeof import typeof_impl

from minidp.kernels.jit import use_kernels

# CBLAS's enumerations (cblas.h)
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

# (symbol prefix, suffix, integer type): NumPy's wheels ship scipy-openblas with 64-bit
# integers and prefixed, suffixed names; a system OpenBLAS or MKL has the plain ones.
_NAMES = (("scipy_", "64_", ctypes.c_int64), ("", "64_", ctypes.c_int64),
          ("scipy_", "", ctypes.c_int), ("", "", ctypes.c_int))

# The dtypes whose regions have parallel kernels: float32, what a step trains in. Compiling
# them for float64 too (gradient checks) took 12 s more on the 2-core machine, of a tier
# that every process running threads compiles first.
REGION_DTYPES = (np.dtype(np.float32),)

_found: dict = {}


def _open(path: str) -> dict | None:
    """:func:`_bind` of the library at ``path``; None where ctypes cannot open it."""
    try:
        return _bind(ctypes.CDLL(path))
    except OSError:
        return None


def _typed(function: Any, integer: Any, scalar: Any) -> Any:
    """``function`` (a cblas_?gemm) as a ctypes function whose Numba type is kept.

    Numba types each argument of a kernel call, and a ctypes function's type it rebuilds
    from the 14 argument types at every call. The function returned is of a class of its
    own whose type is worked out here, once, by Numba's own rule, so the kernels compiled
    and cached for it are the same. With the chunk kernel typed once too
    (:func:`minidp.kernels.threaded.first_class`), a region kernel's call with no chunks
    to run took 16-18 us on the 2-core machine, against 37 us.
    """
    pointer = ctypes.c_void_p
    prototype = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer,
                                 integer, integer, scalar, pointer, integer, pointer, integer,
                                 scalar, pointer, integer)
    layout = {name: getattr(prototype, name) for name in ("_flags_", "_argtypes_", "_restype_")}
    kind = type("CblasGemm", (prototype,), layout)
    typed = kind(ctypes.cast(function, pointer).value)
    numba_type = make_function_type(typed)
    typeof_impl.register(kind)(lambda value, context: numba_type)
    return typed


def _bind(library: ctypes.CDLL) -> dict | None:
    """{dtype: the library's cblas_?gemm, typed} for float32 and float64, or None."""
    for prefix, suffix, integer in _NAMES:
        try:
            functions = {np.dtype(np.float32): getattr(library, f"{prefix}cblas_sgemm{suffix}"),
                         np.dtype(np.float64): getattr(library, f"{prefix}cblas_dgemm{suffix}")}
        except AttributeError:
            continue
        functions = {dtype: _typed(function, integer,
                                   ctypes.c_float if dtype == np.float32 else ctypes.c_double)
                     for dtype, function in functions.items()}
        return functions if all(_gives_numpys_bits(f, d) for d, f in functions.items()) else None
    return None


def _gives_numpys_bits(function: Any, dtype: Any) -> bool:
    """Whether ``function`` multiplies as NumPy's matmul does, bit for bit (tried once).

    A library reached under the wrong names, or with the wrong integer width, would give
    other numbers (or other bits): it is then not used.
    """
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(dtype) for shape in ((5, 7), (3, 7)))
    c = np.empty((5, 3), dtype)
    function(ROW_MAJOR, NO_TRANS, TRANS, 5, 3, 7, 1.0, a.ctypes.data, 7, b.ctypes.data, 7,
             0.0, c.ctypes.data, 3)
    return bool(np.array_equal(c, a @ b.T))


def _libraries() -> list[str]:
    """The BLAS libraries loaded in this process, NumPy's own (in its directory) first."""
    from threadpoolctl import ThreadpoolController

    paths = [lib.filepath for lib in ThreadpoolController().select(user_api="blas").lib_controllers]
    numpy_dir = os.path.dirname(os.path.abspath(np.__file__))  # its wheel's libraries: beside it
    return sorted(paths, key=lambda path: not os.path.abspath(path).startswith(numpy_dir))


def native(dtype: Any) -> Any:
    """The ctypes ``cblas_?gemm`` for ``dtype`` (float32, float64), or None (see above)."""
    if "functions" not in _found:
        np.ones((2, 2)) @ np.ones((2, 2))  # NumPy loads its BLAS at the first product
        _found["functions"] = next((f for f in map(_open, _libraries()) if f), {})
    return _found["functions"].get(np.dtype(dtype))


def region_gemm(arrays: list, sizes: tuple, plan: Any) -> Any:
    """NumPy's cblas_?gemm when a region runs as one parallel kernel, else None.

    It does for a :class:`~minidp.kernels.threaded.Plan` of more than one thread (on one
    there is no GIL to share), on the Numba kernels, with every array of one dtype of
    :data:`REGION_DTYPES` and its product found (:func:`native`), every array
    C-contiguous, aligned and writeable (the region kernels are compiled for such arrays
    only: :func:`minidp.kernels.threaded.first_class`), and no side of the chunk's
    products (``sizes``) of 1: NumPy multiplies a vector by gemv, whose bits are not
    gemm's.
    """
    dtypes = {a.dtype for a in arrays}
    if (plan.threads < 2 or not use_kernels(*arrays) or len(dtypes) != 1
            or dtypes.pop() not in REGION_DTYPES or min(sizes) < 2
            or not all(a.flags.c_contiguous and a.flags.aligned and a.flags.writeable
                       for a in arrays)):
        return None
    return native(arrays[0].dtype)


def _operand(x: Any) -> tuple | None:
    """(transpose flag, leading dimension) of a 2-D operand for a row-major cblas call.

    As NumPy's matmul passes them: a C-contiguous matrix untransposed, a Fortran-ordered
    one (the transpose of a C-contiguous matrix) transposed. None for any other layout.
    """
    if not x.flags.aligned:
        return None
    if x.flags.c_contiguous:
        return NO_TRANS, x.shape[1]
    if x.flags.f_contiguous:
        return TRANS, x.shape[0]
    return None


def add_product(a: Any, b: Any, out: Any) -> bool:
    """``out += a @ b`` as one cblas_?gemm with beta = 1, where it can; whether it did.

    Where ``out`` holds zeros, the result has the bits of ``out += a @ b`` in NumPy, that
    is of ``0 + (a @ b)``: the BLAS adds each block of the sum over ``k`` into ``out``
    (its own ``a @ b`` starts from a zeroed result the same way), and adding the block
    to zero is exact, a negative zero becoming a positive one in both. Into a nonzero
    ``out``, the blocks are added one by one rather than their sum at the end: the same
    value up to float summation order, where ``k`` spans more than one of the BLAS's
    blocks (hundreds of columns).

    It does for NumPy arrays of one dtype whose product :func:`native` found: ``a``
    (m, k) and ``b`` (k, n) each C- or Fortran-ordered, ``out`` (m, n) C-contiguous,
    aligned and writeable, every side at least 2 (NumPy multiplies a vector by gemv,
    whose bits are not gemm's). Otherwise it returns False and touches nothing: the
    caller adds NumPy's product.
    """
    if not (isinstance(out, np.ndarray) and isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)):
        return False
    if a.ndim != 2 or b.ndim != 2 or a.dtype != out.dtype or b.dtype != out.dtype:
        return False
    (m, k), n = a.shape, b.shape[1]
    if (b.shape[0] != k or out.shape != (m, n) or min(m, n, k) < 2
            or not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable)):
        return False
    function = native(out.dtype)
    left, right = _operand(a), _operand(b)
    if function is None or left is None or right is None:
        return False
    function(ROW_MAJOR, left[0], right[0], m, n, k, 1.0, a.ctypes.data, left[1],
             b.ctypes.data, right[1], 1.0, out.ctypes.data, n)
    return True
