"""The command lines' argument parser, with the CLI's error contract.

Contract: `OneLineParser` is `argparse.ArgumentParser` whose errors (an unknown option, a missing
one, a value of the wrong type or choice) raise `DFlash2Error` with one line naming the option,
instead of printing the usage block and exiting, so `dflash2.cli.main` prints them like every
other bad input (`error: ...`, exit status 2). It also refuses an argument that is not UTF-8 text
(bytes a shell passed through undecoded), naming the option. Sub-parsers inherit the class.
"""
from __future__ import annotations

import argparse

from dflash2.errors import DFlash2Error


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise DFlash2Error(message)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        self._require_text(namespace)
        return namespace, extras

    def _require_text(self, namespace: argparse.Namespace) -> None:
        for dest, value in vars(namespace).items():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, str):
                    _require_utf8(item, self._option_name(dest))

    def _option_name(self, dest: str) -> str:
        for action in self._actions:
            if action.dest == dest:
                return action.option_strings[-1] if action.option_strings else action.metavar or dest
        return dest


def _require_utf8(text: str, option: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(text[err.start]) - 0xDC00 if 0xDC80 <= ord(text[err.start]) <= 0xDCFF else None
        shown = f"byte 0x{byte:02x}" if byte is not None else f"character {text[err.start]!r}"
        raise DFlash2Error(f"{option} is not UTF-8 text ({shown} at position {err.start}); pass UTF-8 text") from None
