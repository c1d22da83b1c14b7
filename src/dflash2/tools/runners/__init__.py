"""Engine runner scripts, each run as `PYTHON RUNNER.py RESULT.json < request.json` in its own venv.

They import nothing of dflash2 (their venvs do not have it); `eval.engine_peers.RUNNERS` finds them.
"""
