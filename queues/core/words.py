"""Yes and no in words, one list for every place that reads them: the settings' yes/no variables
(``mrtadmin/settings.py``) and the API's true/false fields (``queues/web/api_door.py``)."""

from __future__ import annotations

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def yes_or_no(text: str) -> bool | None:
    """True or False for one of the words (any case, spaces around), None for anything else."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None
