"""sysbench-gpu: offline inference, judging and attention attribution for SysBench.

The pipeline is data (``datasets``) -> generate (``generation``) -> judge (``judging``)
-> metrics -> report (``reporting``), with attention capture (``attention``) beside it.
Each stage reads and writes documented files in a run directory
(see ``docs/run-directory.md``), so any stage can be rerun alone.
"""

__version__ = "0.1.0"
