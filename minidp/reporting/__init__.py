"""Reading runs back: their files, ``report`` and its plots, ``compare``, the job launcher.

Read in this order: ``readback.py`` (a run's files read safely: regular files only, the
form minidp writes checked), ``runs.py`` (a run directory read back without MPI),
``report.py`` (``python -m minidp report``) and ``plots.py`` (its figures),
``launcher.py`` (starting ``mpiexec`` jobs, ending them whole) with ``shm.py`` (the
shared-memory files a job used, removed after it), ``compare.py`` (several strategies
trained alike, then reported). Nothing here calls MPI itself.
"""
