"""How the command-line tools end on an error: one exit status convention and a one-line message.

============  ==================================================================================
exit status   meaning
============  ==================================================================================
0             done
2             bad usage or input: a flag out of range or not applying, a file or folder that is
              missing, malformed or of another kind, a folder another process is writing. Nothing
              was run (and nothing written) that a corrected command would not redo
1             a failure while running: the disk filled up, the Hub refused, a device failed, a bug
============  ==================================================================================

Either way the tool prints one line to stderr, ``PROG: error: MESSAGE``, where the message names the file
(with its line), the field or the flag, and what was expected. The Python traceback is printed only with
``--debug`` on the command line or ``WHIFLASH_DEBUG=1`` in the environment. Parser errors (an unknown flag,
a value of the wrong type) keep jsonargparse's usage message and status 2. Only the standard library (and `whiflash.settings`,
itself standard library only) is imported here.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from whiflash import settings

__all__ = ["DEBUG_ENV", "DEBUG_FLAG", "FAILURE", "USAGE", "UsageError", "error_line", "exit_status", "run_cli",
           "split_debug"]

USAGE = 2
"""Exit status of a refused command (bad usage or input)."""
FAILURE = 1
"""Exit status of a command that failed while running."""
DEBUG_FLAG = "--debug"
DEBUG_ENV = settings.DEBUG
"""``WHIFLASH_DEBUG=1`` prints the traceback of an error, as ``--debug`` does."""


class UsageError(ValueError):
    """A refusal of what the user gave (flag, file, folder); the message names it and what was expected."""


# Errors that are refusals of the input. ValueError covers the toolkit's own refusals (FolderKindError,
# DatasetFormatError, UsageError) and malformed files; KeyError is what strict checkpoint loading raises for
# a missing or unexpected key. Other OSErrors (a full disk, a failed read) are failures while running.
_USAGE_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, FileNotFoundError, NotADirectoryError,
                                                   IsADirectoryError, FileExistsError)


def exit_status(error: BaseException) -> int:
    """The exit status an error ends a command with: :data:`USAGE` for refusals, :data:`FAILURE` otherwise."""
    if getattr(error, "exit_status", None) in (USAGE, FAILURE):  # an error class may say which it is
        return int(error.exit_status)  # type: ignore[attr-defined]
    return USAGE if isinstance(error, _USAGE_ERRORS) else FAILURE


def error_line(error: BaseException) -> str:
    """The error as one line: its message (a KeyError's without the quotes ``str`` adds), else its type."""
    text = error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else str(error)
    text = " ".join(str(text).split())  # one line: tracebacks of wrapped errors and newlines folded away
    return text or type(error).__name__


def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether the traceback is wanted (the flag, or ``WHIFLASH_DEBUG=1``)."""
    rest = [a for a in argv if a != DEBUG_FLAG]
    wanted = len(rest) != len(argv) or settings.debug()
    return rest, wanted


def _close_progress_bars() -> None:
    """End the progress bars an error left open, so that the error starts a line of its own."""
    tqdm = sys.modules.get("tqdm")  # only when the command used one: importing it here would cost for nothing
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def run_cli(prog: str, main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> NoReturn:
    """Run ``main(argv)`` (``sys.argv[1:]`` by default, ``--debug`` taken out) and exit with its status: 0 or its
    return value, else the convention above, with ``PROG: error: MESSAGE`` on stderr."""
    args, debug = split_debug(sys.argv[1:] if argv is None else argv)
    try:
        code = main(args)
    except SystemExit:  # the parser's own exits (--help, usage errors) keep their status and message
        raise
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as error:  # noqa: BLE001 - every error ends the command, as one line
        _close_progress_bars()
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {error_line(error)}", file=sys.stderr)
        sys.exit(exit_status(error))
    sys.exit(int(code or 0))
