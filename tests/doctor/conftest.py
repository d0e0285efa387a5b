from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_text():
    def read(rel: str) -> str:
        return (FIXTURES / rel).read_text()

    return read
