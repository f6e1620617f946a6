"""Evaluation plans: ``sysbench-gpu run PLAN.toml`` runs what one file describes (docs/plans.md).

A plan names the data, the models (engine, options, sampling, ablations), the judge and
the outputs wanted. It sits between the faces and ``explore``: every step is a verb's own
command (generate, judge, metrics, attention, arena, explore, report) run in a child
process, so each run directory is what the verb typed by hand would have made, plus the
plan's path and SHA-256 in its manifest. Modules by job: ``schema`` (the tables and keys),
``plan`` (reading and checking a file), ``verbs`` (the verbs' own parsers), ``steps`` (the
commands), ``status`` and ``upper_bound`` (what is done; the judge's estimate), ``child``
(one step as a process), ``execute`` (the run), ``dry_run``, ``result``, ``api``
(``run_plan``) and ``cli`` (the ``run`` verb).
"""
