"""Explore stage: ``sysbench-gpu explore``, a static site over runs and attention folders.

``data`` reads runs through their benchmark (metrics, layout), ``sessions`` the session
rows and pages (verdicts or scores per turn, from the benchmark's ``turn_view``),
``attention`` the attention stage's output, ``site`` writes the pages from ``assets/``
(docs/explore.md). Sits above reporting: it shows the runs' metrics.
"""
