"""One training run: the Trainer, its settings, its directory, checkpoints, signals, faults.

Read in this order: ``config.py`` (:class:`~minidp.run.config.TrainConfig` and its checks)
and ``flags.py`` (the command line and TOML files that fill it), ``trainer.py`` (the loop),
``replica.py`` (the GPU path: it only moves data), ``evaluation.py`` (the consensus
model evaluated at each epoch's end), ``state.py`` and ``checkpoint.py`` (what a checkpoint
holds, and how it is written and resumed), ``rank_file.py`` (one rank's file of it, read
back checked) and ``compatible.py`` (whether a checkpoint can continue this run),
``rundir.py`` (one run per directory), ``claim.py`` (the job that holds it, alive or
not), ``run_json.py`` (the claim and the record of the run), ``owned.py`` (what in a run
directory is minidp's), ``files.py`` (``metrics.jsonl``, ``summary.json``, ``model.npz``,
``trace.json``),
``signals.py`` and ``stopping.py`` (SIGTERM, SIGUSR1 and SIGINT: caught before MPI starts,
then agreed on), ``faults.py`` (injected failures), ``console.py``
(what rank 0 prints) and ``errors.py``.

Nothing is imported here, so ``minidp.run.errors`` stays light; the public names are
``minidp.run.trainer.Trainer``, ``minidp.run.trainer.train`` and
``minidp.run.config.TrainConfig``.
"""
