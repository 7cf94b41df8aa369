"""Reading runs back: their files, ``report`` and its plots, ``compare``, the job launcher.

Read in this order: ``runs.py`` (a run directory read back without MPI), ``report.py``
(``python -m minidp report``) and ``plots.py`` (its figures), ``launcher.py`` (starting
``mpiexec`` jobs), ``compare.py`` (several strategies trained alike, then reported).
Nothing here calls MPI itself.
"""
