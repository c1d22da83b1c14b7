"""Files: what dflash2 reads from and writes to disk, safely.

- `atomic`: atomic file and directory writes, the one rule for a command's output directory, reports.
- `weights`: weight files: safetensors headers and finite values checked without a model, and
  writers whose disk errors are one line.
- `userjson`: a user's JSON text, refused in one line when malformed or nested too deeply.
- `cache`: where converted targets and stored calibrations are kept (`DFLASH2_CACHE`).
- `calibration`: the cost model's start-up calibration as stored there (key, format, age).
"""
