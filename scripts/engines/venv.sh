# Sourced by the engine setup scripts. `engine_venv DIR WANT`: the virtual environment DIR (made
# with $PYTHON, default python3; git-ignored by its own .gitignore), unless a stamp in it already
# records WANT, what the script installs (then the calling script ends here: it is idempotent);
# sets PIP (niced). `engine_done` records the stamp once everything is in.
engine_venv() {
  VENV=$1
  WANT=$2
  STAMP="$VENV/.dflash2-installed"
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
  [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
  echo '*' > "$VENV/.gitignore"
  PIP="nice -n 5 $VENV/bin/python -m pip"
}

engine_done() {
  echo "$WANT" > "$STAMP"
}
