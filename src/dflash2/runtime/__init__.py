"""What a run depends on beyond its inputs.

- `machine`: thread counts and memory this machine can honour, checked before anything loads.
- `provenance`: where a result came from: the git commit and the machine it ran on.
- `dtypes`: the dtype names a user may give.
- `rng`: counter-based random numbers: a row's draws depend on its seed and positions only.
"""
