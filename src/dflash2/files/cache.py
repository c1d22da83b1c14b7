"""Where dflash2 keeps what it makes once and reuses: `cache_dir()` is `$DFLASH2_CACHE` if set,
else `~/.cache/dflash2` (converted built-in targets, stored cost-model calibrations).
`RECALIBRATE_ENV=1` (`--recalibrate`) asks for the stored calibration to be measured again."""
from __future__ import annotations

import os
from pathlib import Path

RECALIBRATE_ENV = "DFLASH2_RECALIBRATE"


def cache_dir() -> Path:
    override = os.environ.get("DFLASH2_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "dflash2"
