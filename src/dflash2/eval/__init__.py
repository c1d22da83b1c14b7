"""Measurement subcommands: `bench` (with `bench_runs`, `bench_report`, `parts`, `plots`, and the peers
`peers` / `engine_peers`), `analyze`, `yardstick`, `ablation` and `families` (arms trained at equal
budget, then measured), and `generate --compare` (`compare`). Profiling tools live in
`tools.profile`; the engines' out-of-process runners in scripts/engines/runners/.
"""
