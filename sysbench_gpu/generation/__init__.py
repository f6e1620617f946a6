"""Generation stage: ``sysbench-gpu generate``.

Turn-synchronous batched generation: every session advances turn by turn together, one
engine call per turn (``scheduler``), on the conversations the run's benchmark builds
(``plan``). Writes ``sessions.json``, ``generations.jsonl``, ``stats.json``, the
``generate`` section of ``manifest.json`` and, for distractor runs, ``distractors.json``
(docs/run-directory.md, docs/generation.md).
"""
