"""The formats of an attention output folder, which capture writes and analysis reads (docs/attention.md, "Output").

Imports nothing of ``attention.capture`` or ``attention.analysis``.
"""
