"""Profiling tools, each `python -m dflash2.tools.profile.NAME`: `cycles` (where a decoding cycle's
time goes, per batch size), `microbench` (component timings side by side), `rollback` (what a
hybrid target's state roll-back costs)."""
