"""The one splicer of generated blocks: a page's text between a begin marker and an end marker (HTML comments in
Markdown) is written by a tool and checked against what it would write. Standard library only."""
from typing import Optional


def splice(text: str, begin: str, end: str, content: str) -> Optional[str]:
    """``text`` with what stands between the line holding ``begin`` and the ``end`` marker after it replaced by
    ``content`` (which ends with a newline); None when ``text`` has no such block."""
    start = text.find(begin)
    stop = text.find(end, start + 1) if start >= 0 else -1
    if start < 0 or stop < start:
        return None
    newline = text.find("\n", start)
    if newline < 0 or newline >= stop:
        return None
    return text[:newline + 1] + content + text[stop:]
