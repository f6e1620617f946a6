"""Attention stage: ``sysbench-gpu attention``.

One teacher-forced forward per session re-runs the conversations generation used
(``conversation``) with a capture on the chosen layers (``hooks``) that takes each row's
share of attention on the system span from the attention kernel's log-sum-exp
(``kernels``, ``span_math``) at the layers ``layers`` picks; ``layout`` places the model
(one device, device map, data or tensor parallel); ``measure`` runs the forwards, ``store``
and ``turn_table`` write, ``analysis`` and ``report`` summarise and draw; ``stage`` is the
command line. Writes, in its own output folder, ``sessions/*.npz``, ``turn_shares.jsonl``,
``summary.json``, figures and ``manifest.json`` (docs/attention.md).
"""
