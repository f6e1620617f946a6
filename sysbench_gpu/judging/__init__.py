"""Judging stage: ``sysbench-gpu judge``.

Asks the judge what the run's benchmark says a turn's judging means (a SysBench checklist,
an MT-Eval 1-10 score, or no judge for rule-scored turns), with retries, a cache, a cost
ledger and resumption (``stage``, ``rounds``, ``cache``, ``ledger``, ``rejudge``), and
measures agreement between judges (``benchmarks.sysbench.agreement``). Reads ``sessions.json`` and
``generations.jsonl``; writes ``judgments.jsonl``, ``judge_ledger.json`` and the ``judge``
section of ``manifest.json`` (docs/judge.md).
"""
