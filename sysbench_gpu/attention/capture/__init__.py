"""What runs the model: conversations laid out as generation built them, forwards, the share capture, knockout.

Capture writes through ``attention.files`` and never imports ``attention.analysis``.
"""
