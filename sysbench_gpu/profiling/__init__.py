"""Profiling stage: ``sysbench-gpu profile``.

Bounds each engine call of a run's ``stats.json`` from below with a roofline
(``roofline``, ``device_specs``, ``inputs``, ``schedule``) and estimates other layouts and
schedules; writes ``profile.json`` and figures to ``--out`` (docs/profile.md).
"""
