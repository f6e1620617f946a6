"""The arena stage: pairwise battles between runs of the same sessions, rated by Bradley-Terry.

``sysbench-gpu arena RUN... --out ARENA_DIR`` reads each run's ``sessions.json``,
``generations.jsonl`` and ``judgments.jsonl`` (through the Benchmark protocol) and writes,
in ``ARENA_DIR`` only: ``battles.jsonl`` (one record per battle and order), ``ratings.json``,
``leaderboard.md``, ``leaderboard.tex``, ``figures/``, ``manifest.json`` (``stages.arena``),
``.arena.lock``, and with ``--by judge`` the judge's ``judge_cache/`` and ledger. See docs/arena.md.

``request`` holds what a call asks and will play; ``checks`` refuses, before the folder is made, an
``--out`` that is an input or another kind of folder, another arena's settings, and a call after which no
battle could have an outcome; ``stage`` then plays, fits and writes under the arena's lock.
"""
