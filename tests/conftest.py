"""Pytest configuration shared by the single-process and the SPMD sessions.

``tests/mpi`` holds SPMD files: they run only under mpiexec (the launcher in
``tests/test_spmd.py`` sets ``MINIDP_SPMD=1``), never in the ordinary session.
"""

import os
import sys

# helpers shared by test directories (spmd launcher, PyTorch twins)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
collect_ignore_glob = [] if os.environ.get("MINIDP_SPMD") else ["mpi/*", "scripts/*"]
