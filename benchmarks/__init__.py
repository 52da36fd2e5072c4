"""trtforge benchmarks: serving against KServe, cold start, control-plane scale, time to recover.

Each benchmark is a module with ``main(argv) -> int`` that prints a table and writes a small JSON
summary to ``benchmarks/results/``; ``python -m benchmarks.run_all`` (``make bench``) runs them all and
draws the plots for ``docs/benchmarks.md``.
"""
