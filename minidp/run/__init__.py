"""One training run: the Trainer, its settings, its directory, checkpoints, signals, faults.

Read in this order: ``config.py`` (:class:`~minidp.run.config.TrainConfig` and its checks)
and ``flags.py`` (the command line and TOML files that fill it), ``trainer.py`` (the loop),
``replica.py`` (the GPU path), ``state.py`` and ``checkpoint.py`` (what a checkpoint
holds, and how it is written and resumed), ``rundir.py`` (one run per directory),
``files.py`` (``metrics.jsonl``, ``summary.json``, ``model.npz``, ``trace.json``),
``signals.py`` and ``stopping.py`` (SIGTERM, SIGUSR1 and SIGINT: caught before MPI starts,
then agreed on), ``faults.py`` (injected failures), ``console.py``
(what rank 0 prints) and ``errors.py``.

Nothing is imported here, so ``minidp.run.errors`` stays light; the public names are
``minidp.run.trainer.Trainer``, ``minidp.run.trainer.train`` and
``minidp.run.config.TrainConfig``.
"""
