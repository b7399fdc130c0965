"""The API reference (docs/api.md) lists every public name of ``qkov`` under a topic, once."""

from __future__ import annotations

import re
import types
from pathlib import Path

import qkov

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_every_public_name_is_in_the_api_reference_once():
    documented = re.findall(r"^\.\. auto(?:class|function):: qkov\.(\w+)$", API.read_text(), re.M)
    public = {n for n in qkov.__all__ if not isinstance(getattr(qkov, n), types.ModuleType)}
    aliases = {n for n in public if getattr(qkov, n).__name__ != n}  # AttnOnlyTransformer
    assert sorted(documented) == sorted(set(documented)), "a name documented twice"
    assert set(documented) == public - aliases
