"""Benchmarks: one folder each behind one protocol (``base.Benchmark``), registered in one place.

The built-in benchmarks are imported here, and nowhere else, so that importing anything
from ``sysbench_gpu.benchmarks`` fills the registry:

- ``sysbench/``: SysBench (system-message following; checklists; CSR, ISR, SSR);
- ``mteval/``: MT-Eval (multi-turn; 1-10 judge and rule scores).

Shared by every benchmark: ``base`` (the protocol, the registry, data and run-session
loading), ``runs`` (a run directory as metrics read it), ``judge_tasks`` (what a judge is
asked), ``judge_text`` (prompt templates and reply repair), ``turn_scoring`` (which turns
count). A benchmark's own modules never import another benchmark's. See docs/architecture.md.
"""

# Registration order: SysBench first, the default where no benchmark is named (`data download`).
from sysbench_gpu.benchmarks.sysbench.benchmark import SysBench

# isort: split
from sysbench_gpu.benchmarks.mteval.benchmark import MTEval

__all__ = ["MTEval", "SysBench"]
