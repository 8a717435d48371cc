"""The benchmark engine shared by ``edgeattn bench`` and the scripts under ``benchmarks/``.

Benchmarks print a table and write JSON; they never assert timings.
"""
