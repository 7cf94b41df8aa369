"""Which kernels the BLAS runs, and whether this CPU could run wider ones.

Every convolution and linear layer ends in a GEMM, so the BLAS's kernels set the step's
ceiling. OpenBLAS (NumPy's BLAS) picks them for the CPU it finds, unless
``OPENBLAS_CORETYPE`` names a core type: then it runs that type's kernels on any CPU that
can. A site that pins an older type for the same bits on every machine (``Haswell``,
AVX2) leaves a CPU with AVX-512 at half its rate. Measured on an AMD EPYC with AVX-512
(docs/benchmarks.md, machine D): a 2048 x 2048 float32 GEMM ran at 107 GFLOP/s on one
thread with ``OPENBLAS_CORETYPE=Haswell``, and at 206 with the SkylakeX kernels OpenBLAS
picks there by itself. PyTorch does not read the variable (its convolutions are
oneDNN's), so a comparison run under the pin measures minidp on half the GEMM.

minidp never changes the setting: it is the user's, and it decides the BLAS's bits.
``python -m minidp info`` reports the kernels (``"blas"``) and, where they are narrower
than the CPU, says so and what to change.
"""

from __future__ import annotations

import os

# OpenBLAS's core types whose kernels use AVX-512 (the names openblas_get_corename gives,
# which threadpoolctl reports as "architecture").
AVX512_TYPES = ("SkylakeX", "Cooperlake", "SapphireRapids")


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this machine's first CPU (Linux's /proc/cpuinfo).

    Empty where they cannot be read (another system): then nothing is claimed of them.
    """
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith("flags")]
    except OSError:
        return frozenset()
    return frozenset(lines[0].split(":", 1)[1].split()) if lines else frozenset()


def narrower_than_cpu(kernels: str | None, flags: frozenset[str],
                      pinned: str | None) -> str | None:
    """What to change when OpenBLAS's ``kernels`` lack the AVX-512 the CPU has (else None).

    Args:
        kernels: the core type OpenBLAS runs (None: not known).
        flags: the CPU's flags (:func:`cpu_flags`).
        pinned: the value of ``OPENBLAS_CORETYPE``, or None where it is not set.
    """
    if kernels is None or kernels in AVX512_TYPES or "avx512f" not in flags:
        return None
    if pinned:
        return (f"OPENBLAS_CORETYPE={pinned} runs OpenBLAS's {kernels} kernels, without "
                f"AVX-512, on a CPU that has it: unset it for the kernels OpenBLAS picks for "
                f"this CPU (twice the GEMM rate on one such CPU, docs/benchmarks.md); the "
                f"BLAS's bits then change")
    return (f"OpenBLAS chose its {kernels} kernels, without AVX-512, on a CPU that has it "
            f"(a CPU newer than this OpenBLAS knows): OPENBLAS_CORETYPE=SkylakeX runs its "
            f"AVX-512 kernels; measure before keeping it")


def blas_info() -> list[dict]:
    """Each BLAS library loaded, for ``python -m minidp info``.

    Its kernels, the variable that pinned them, and a note where they are narrower than
    the CPU.
    """
    from threadpoolctl import threadpool_info

    pinned = os.environ.get("OPENBLAS_CORETYPE") or None
    flags = cpu_flags()
    report = []
    for pool in threadpool_info():
        if pool.get("user_api") != "blas":
            continue
        openblas = pool.get("internal_api") == "openblas"
        entry = {"library": pool.get("internal_api"), "version": pool.get("version"),
                 "kernels": pool.get("architecture"),
                 "pinned_by": f"OPENBLAS_CORETYPE={pinned}" if openblas and pinned else None}
        note = narrower_than_cpu(entry["kernels"], flags, pinned) if openblas else None
        if note:
            entry["note"] = note
        report.append(entry)
    return report
