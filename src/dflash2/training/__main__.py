"""`python -m dflash2.training CONFIG.yaml key=value ...` (same as `dflash2 train`)."""
import sys

from dflash2.errors import DFlash2Error
from dflash2.training.trainer import main

try:
    sys.exit(main())
except DFlash2Error as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
