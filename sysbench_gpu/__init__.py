"""sysbench-gpu: offline inference, judging and attention attribution for SysBench.

The pipeline is data (``datasets``) -> generate (``generation``) -> judge (``judging``)
-> metrics -> report (``reporting``), with attention capture (``attention``) beside it.
Each stage reads and writes documented files in a run directory
(see ``docs/run-directory.md``), so any stage can be rerun alone. ``sysbench-gpu run PLAN.toml``
(``plans``) runs them all from one file; ``sysbench_gpu.api`` is the same as Python functions.
Importing this package loads nothing heavy.
"""

__version__ = "0.1.0"
