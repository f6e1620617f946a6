"""Attention hooks that the engines and the attention stage share (below both; torch and transformers imported lazily).

``registry``: register an attention function with transformers for one block and switch a
model to it, restoring everything on exit. ``key_bias``: an additive bias on a key span,
seen by the queries after it, at chosen layers and heads (knockout: -inf; steering: log α).
``layer_bands``: the ``--knockout-layers`` / ``--steer-layers`` syntax.
"""
