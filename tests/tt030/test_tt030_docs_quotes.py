"""TorchTitan 0.3.0's command output quoted in the docs is what the command prints now (the
markers with ``torchtitan 0.3``; tests/support/docs_quotes.py). Regenerate them in the 0.3.0
venv with ``python tests/unit/test_docs_quotes.py --update``."""

from __future__ import annotations

import pytest

from tests.support.docs_quotes import expected_body, find_quotes

QUOTES = [q for q in find_quotes() if q.series == "0.3"]


def test_the_docs_quote_some_0_3_0_output():
    assert len(QUOTES) >= 1  # a marker typo would silently drop a quote


@pytest.mark.parametrize("quote", QUOTES, ids=[q.name for q in QUOTES])
def test_quoted_output_is_what_the_command_prints(quote):
    assert quote.body == expected_body(quote), (
        f"{quote.name} quotes `{quote.command}`, whose output changed: run "
        "`python tests/unit/test_docs_quotes.py --update` in the 0.3.0 venv and review the diff")
