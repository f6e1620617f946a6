"""Attention stage: ``sysbench-gpu attention``, ``attention-plot`` and ``attention-analyze``.

The verbs over three subpackages: ``stage`` and ``analysis.interp_report`` may import any of
them, ``capture`` and ``analysis`` never import each other, and both sit on ``files``, which
imports neither (import-linter keeps it so, pyproject.toml):

* ``stage``: the ``attention`` and ``attention-plot`` verbs; measures, then finishes.
* ``capture``: runs the model. One teacher-forced forward per session re-runs the
  conversations generation used (``conversation``, ``segments``) with a capture on the
  chosen layers (``hooks``) that takes each row's share of attention on the system span
  from the attention kernel's log-sum-exp (``kernels``, ``span_math``, ``chunks``,
  ``layer_call``) at the layers ``layers`` picks; ``layout`` places the model (one device,
  device map, data or tensor parallel); ``measure`` runs the forwards and writes;
  ``knockout`` runs the forwards with the system span's keys hidden.
* ``analysis``: reads what capture wrote. ``turn_stats`` and ``figures`` summarise and
  draw, ``report`` closes the stage; ``head_table``, ``heads``, ``probe``, ``decay`` and
  ``interp_report`` (the ``attention-analyze`` verb) map heads, probe failures and fit
  decay; ``knockout_report`` summarises knockout; ``outcomes`` reads each turn's outcome
  through the run's benchmark. Analysis never imports capture: it reads files.
* ``files``: the output folder's formats, shared by both (``store``: arrays, shards,
  manifest; ``turn_table``: the per-turn rows; ``knockout_rows``: ``knockout.jsonl``).

Writes, in its own output folder, ``sessions/*.npz``, ``turn_shares.jsonl``,
``analysis.json``, figures and ``manifest.json`` (docs/attention.md).
"""
