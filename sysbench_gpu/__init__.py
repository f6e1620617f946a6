"""sysbench-gpu: offline inference, judging and attention attribution for SysBench.

The pipeline is data -> batch_infer -> judge -> metrics -> report, with attn_hooks
beside it. Each stage reads and writes documented files in a run directory
(see ``docs/run-directory.md``), so any stage can be rerun alone.
"""

__version__ = "0.1.0"
