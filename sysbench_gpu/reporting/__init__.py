"""Reporting stage: ``sysbench-gpu metrics``, ``compare`` and ``report``.

Reads run directories (``sessions.json``, ``judgments.jsonl``, ``manifest.json``) and
asks each run's benchmark for its metrics, comparisons, tables and figures; writes only
to stdout and, for ``report``, its ``--out`` folder (``report.md``, ``report.json``,
tables and figures). Never imports torch or vLLM (docs/metrics.md).
"""
