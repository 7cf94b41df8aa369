"""``minidp simulate``: epoch time and communication share predicted at cluster scale.

Read in this order: ``costs.py`` (each strategy's alpha-beta formulas) and ``elastic.py``
(the elastic family's), ``measure.py`` (one step and one memory sweep timed on this
machine), ``predict.py`` (the flags checked, the epochs predicted, and which strategies
are modelled: a table keyed by the strategy's class), ``command.py`` (the
tables the command prints) and ``validate.py`` (the same configuration run for real here,
predicted against measured).
"""
