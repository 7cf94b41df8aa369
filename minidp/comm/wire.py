"""Half-precision wire formats: 2-byte words on the rails, summed in float32.

DASO's down-cast (``daso.downcast=bf16|fp16``) sends parameters as 16-bit words, as
Heat does with ``torch.bfloat16`` tensors. NumPy has no bfloat16 and MPI no 16-bit
float sum, so the words travel as ``uint16`` and are added by a user-defined MPI
reduction that decodes both operands to float32, adds them and rounds the sum back to
16 bits: each partial sum is rounded once, as a 16-bit allreduce in NCCL or Gloo does.

Why a reduction and not an allgather followed by a local float32 sum: the allgather
sends (P - 1) slices per rank, the ring allreduce 2(P - 1)/P of one, so the reduction
keeps halving the bytes at any node count; the cost is one Python call per message
MPI combines (a few per sync: the vectors are long, the messages few).

Rounding: bfloat16 keeps the top 16 bits of a float32, rounded to nearest even (NaN
stays NaN); float16 is IEEE binary16 (NumPy's cast rounds to nearest even).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.comm.network import charged, ring_traffic
from minidp.comm.topology import Topology

KINDS = ("bf16", "fp16")


def _check(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"wire format: got {kind!r}, allowed: {', '.join(KINDS)}")


def encode(values: np.ndarray, kind: str, out: np.ndarray) -> np.ndarray:
    """Round ``values`` to ``kind`` and store the 16-bit words in ``out`` (uint16)."""
    _check(kind)
    if kind == "fp16":
        out.view(np.float16)[...] = values
        return out
    bits = values.astype(np.float32).view(np.uint32)
    # Round to nearest even on the 16 bits that are dropped.
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out[...] = rounded >> np.uint32(16)
    nan = np.isnan(values)
    if nan.any():  # rounding could carry a NaN's payload into infinity
        out[nan] = 0x7FC0
    return out


def decode(words: np.ndarray, kind: str, out: np.ndarray) -> np.ndarray:
    """The float values of 16-bit ``words``, written into ``out`` (any float dtype)."""
    _check(kind)
    if kind == "fp16":
        out[...] = words.view(np.float16)
        return out
    out[...] = (words.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


def round_to(values: np.ndarray, kind: str) -> np.ndarray:
    """``values`` rounded to ``kind``'s precision, in their own dtype (a new array)."""
    words = encode(values, kind, np.empty(values.shape, np.uint16))
    return decode(words, kind, np.empty_like(values))


class HalfSum:
    """The MPI reduction ``inout <- round16(float32(in) + float32(inout))`` on uint16 words.

    One per strategy (an ``MPI.Op`` must be created after MPI starts); :meth:`free`
    releases it.
    """

    def __init__(self, kind: str) -> None:
        _check(kind)
        self.kind = kind
        self.op = MPI.Op.Create(self._combine, commute=True)

    def _combine(self, inbuf: MPI.buffer, inoutbuf: MPI.buffer, datatype: MPI.Datatype) -> None:
        a = np.frombuffer(inbuf, dtype=np.uint16)
        b = np.frombuffer(inoutbuf, dtype=np.uint16)
        total = decode(a, self.kind, np.empty(a.size, np.float32))
        total += decode(b, self.kind, np.empty(b.size, np.float32))
        encode(total, self.kind, b)

    def rail_sum(self, words: np.ndarray, topology: Topology) -> np.ndarray:
        """Blocking sum of ``words`` over this rank's rail, in place (charged at 2 B/word)."""
        if words.dtype != np.uint16 or words.ndim != 1:
            raise TypeError(f"rank {topology.rank}: wire words must be a 1-D uint16 array, "
                            f"got {words.dtype} {words.shape}")
        guard.check_same(topology.cross, f"rail allreduce {self.kind}", words)
        if topology.num_nodes > 1 and words.size:
            traffic = ring_traffic(topology.num_nodes, words.nbytes)
            drawn = topology.arrows.collective("rail", f"rail sum {self.kind}", traffic[1])
            with charged("inter", f"rail_allreduce_{self.kind}", *traffic), drawn:
                guard.wait(topology.cross.Iallreduce(MPI.IN_PLACE, words, op=self.op),
                           topology.cross, f"rail allreduce {self.kind}")
        return words

    def free(self) -> None:
        """Release the MPI operation (idempotent)."""
        if self.op != MPI.OP_NULL:
            self.op.Free()
