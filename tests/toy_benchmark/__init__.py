"""A toy benchmark, kept in tests: the worked example of adding a benchmark (docs/architecture.md).

``benchmark.py`` is the whole benchmark: one class, registered by ``@register_benchmark`` when
the module is imported, as ``sysbench_gpu/benchmarks/<name>/benchmark.py`` is. Nothing in the
package names it; ``tests/test_toy_benchmark.py`` imports it and runs every stage on it.
"""
