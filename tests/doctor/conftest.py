from __future__ import annotations

import pytest

from tests.doctor.corpus import FIXTURES, tool_output


@pytest.fixture
def fixture_text():
    def read(rel: str) -> str:
        return tool_output(FIXTURES / rel)

    return read
