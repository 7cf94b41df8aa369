"""Pytest configuration shared by the single-process and the SPMD sessions.

``tests/mpi`` holds SPMD files: they run only under mpiexec (the launcher in
``tests/test_spmd.py`` sets ``MINIDP_SPMD=1``), never in the ordinary session.
"""

import os

collect_ignore_glob = [] if os.environ.get("MINIDP_SPMD") else ["mpi/*", "scripts/*"]
