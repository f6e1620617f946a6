"""What reads an attention output folder: per-turn statistics, figures, heads, probe, decay, knockout summaries.

Analysis reads the folder through ``attention.files`` and never imports ``attention.capture``
(no model, no torch): every number here comes from the files a capture wrote.
"""
