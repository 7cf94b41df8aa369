"""``minidp train`` whose files may not grow past a limit: a full disk, without root.

Usage: ``python -m mpi4py tests/scripts/train_file_limit.py BYTES train ...``. The limit
(RLIMIT_FSIZE) is set after MPI has made its shared-memory segments, which are files
too; then a write past BYTES fails with EFBIG, as a write to a full disk fails with
ENOSPC (Python ignores SIGXFSZ, so the write returns the error).
"""

import resource
import sys

from mpi4py import MPI  # noqa: F401 (initialises MPI before the limit)

from minidp.__main__ import main

limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[2:]))
