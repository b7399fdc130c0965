"""The ``qkov`` command: thin argument parsing around the library, one module per command.

Every :class:`QkovError` becomes one line on stderr and exit status 2. Each command imports the
library (and torch) only when it runs, so ``qkov --version``, ``--help`` and an argument error
answer at once.
"""

from __future__ import annotations

import os
import sys

from qkov.cli.analyze import add_analyze_parser, analyze_command
from qkov.cli.common import Parser, one_line
from qkov.cli.imports import add_import_parser, import_command
from qkov.cli.info import add_info_parsers, info_command, schema_command
from qkov.cli.reproduce import add_reproduce_parser, reproduce_command
from qkov.cli.series import add_series_parser, series_command
from qkov.cli.serve import add_serve_parser, serve_command
from qkov.cli.train import add_train_parser, train_command
from qkov.errors import QkovError

# PyTorch gives its CPU tensors of 2 MiB and up transparent huge pages (madvise) when this is set at
# its first allocation; a value the user set is kept (0: off). A lazy analysis maps every such
# temporary fresh from the system (machine.return_freed_blocks): at Llama-3.2-1B's shape it took
# 5.8x fewer page faults and a third less system time. Only there: GPT-2's analyze read whole,
# whose heap keeps its blocks, took 1.04-1.08x the time with it (benchmarks/README.md, "Huge pages").
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"


def main(argv: list[str] | None = None) -> None:
    from qkov import __version__

    parser = Parser(prog="qkov", description="Transformer circuits, read off the weights.")
    parser.add_argument("--version", action="version", version=f"qkov {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_analyze_parser(sub)
    add_reproduce_parser(sub)
    add_serve_parser(sub)
    add_import_parser(sub)
    add_series_parser(sub)
    add_info_parsers(sub)
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is shown escaped, not a traceback
        if callable(getattr(stream, "reconfigure", None)):
            stream.reconfigure(errors="backslashreplace")
    args = parser.parse_args(argv)
    if getattr(args, "weights_only", False) or getattr(args, "lazy", False):
        os.environ.setdefault(HUGE_PAGES, "1")  # before any tensor: torch reads it once
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        {
            "train": train_command,
            "info": info_command,
            "schema": schema_command,
            "analyze": analyze_command,
            "reproduce": reproduce_command,
            "serve": serve_command,
            "import": import_command,
            "series": series_command,
        }[args.command](args)
    except QkovError as err:
        print(f"qkov: error: {one_line(str(err))}", file=sys.stderr)
        sys.exit(2)
