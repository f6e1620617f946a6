"""MT-Eval (Kwan et al., arXiv 2401.16745) as a second multi-turn benchmark.

- ``tasks``: the tasks, their categories and scorers, and upstream's config and file names.
- ``data``: task files (JSON Lines) -> the shared Session/Turn model; statistics, download.
- ``conversation``: the messages of an answered turn under model or reference (gold) history.
- ``rules``: rule scorers (recollection cls, recollection global-inst) and text counts.
- ``judge_prompt``: the 1-10 LLM judge for refinement, expansion and follow-up.
- ``metrics``: per-task, per-category, per-turn and overall scores with bootstrap CIs.
- ``tables``: the leaderboard-layout table and paired comparisons as Markdown.
- ``scoring``: the judge stage on MT-Eval runs (1-10 judge tasks, rule-scored records).
- ``run_metrics``: ``metrics`` and ``compare`` on MT-Eval run directories.
- ``report``, ``figures``: ``report`` on MT-Eval runs (the leaderboard layout) and its figure.
- ``benchmark``: MT-Eval behind the Benchmark protocol; registers it.

See docs/mteval.md.
"""
