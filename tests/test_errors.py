"""``QkovError`` (``errors.py``) is the one exception for bad input: the command line turns it into one
line on stderr and exit status 2, and lets anything else (a bug in qkov) through as a traceback."""

from __future__ import annotations

import pytest

from qkov import cli
from qkov.errors import QkovError


def test_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["info", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("qkov: error: ") and err.count("\n") == 1 and str(tmp_path / "missing") in err


def test_a_bug_is_not_dressed_up_as_bad_input(monkeypatch, tmp_path):
    def broken(args):
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "info_command", broken)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["info", str(tmp_path)])
    assert issubclass(QkovError, Exception) and not issubclass(ValueError, QkovError)
