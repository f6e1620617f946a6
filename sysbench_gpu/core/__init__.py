"""Core: what every layer above shares, importing nothing from them.

- ``errors``: the one exception type and the file/session/turn/field locator.
- ``sessions``: sessions, turns, constraints, datasets and session-id selections.
- ``chat``: the chat message type; ``messages``: a turn's conversation and system-role folding.
- ``records``, ``rundir``: a run directory's records and files (atomic writes, append-only JSON Lines).
- ``ablation_files``, ``loaded_run``: a run's history ablation as files (manifest fields, distractors.json);
  a run directory as every benchmark's metrics read it.
- ``jsonio``, ``jsonl``, ``locks``, ``redact``: JSON reading, locked appends, one writer per stage, secrets.
- ``verdicts``: the verdict vocabulary; ``stats``: session bootstrap and CIs.
- ``tables``, ``plotting``: tables rendered as Markdown/LaTeX and figure plumbing (matplotlib lazily).
- ``arguments``: the checks of the flags many verbs share, run before any folder is made; ``verb_args``: a
  verb's arguments from Python values; ``progress``: a bar on a terminal, timed lines in a log file.
"""
