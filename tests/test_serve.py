"""``qkov serve`` (``serve/__init__.py``): a non-loopback host is warned about, and a missing
checkpoint is refused in one line."""

from __future__ import annotations

import pytest

import qkov
from qkov.serve import is_loopback, serve


def test_a_non_loopback_host_is_warned_about(capsys, tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    with pytest.raises(qkov.QkovError, match="no such checkpoint folder"):
        serve(tmp_path / "missing", "0.0.0.0", 8000, 16, 1)
    assert "warning: serving on 0.0.0.0, reachable from other machines" in capsys.readouterr().err


def test_the_command_line_refuses_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    from qkov.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", str(tmp_path / "missing"), "--port", "8123"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qkov: error: {tmp_path / 'missing'}: no such checkpoint folder"
    ]
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--port", "70000"])
    assert "--port must lie in [1, 65535], got 70000" in capsys.readouterr().err
