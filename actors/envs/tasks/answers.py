"""Reading a number out of a free-text reply, as a user would: "The answer is 12." is 12, "**12**" is 12,
"7 + 5 = 12" is 12 (the last number written), "twelve" is nothing."""
from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
_STATED = re.compile(r"(?:answer|result|guess)\s*(?:is|:|=)?\s*\**\s*(-?\d+(?:,\d{3})*(?:\.\d+)?)", re.IGNORECASE)


def last_number(reply: str) -> float | None:
    """The number the reply states as its answer ("answer is N", "answer: N"), else the last number in it."""
    stated = _STATED.findall(reply)
    found = stated or _NUMBER.findall(reply)
    if not found:
        return None
    return float(found[-1].replace(",", ""))
