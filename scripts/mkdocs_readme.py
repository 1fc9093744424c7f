"""MkDocs hook: the home page includes sections of the README, its links made relative to docs/.

A page line `--8<-- "README.md:NAME"` becomes the README's text between `<!-- --8<-- [start:NAME] -->` and
`<!-- --8<-- [end:NAME] -->`. The README links the pages as `docs/PAGE.md`, which from docs/index.md would point
into docs/docs/; they are rewritten to `PAGE.md` before MkDocs checks every link. A section that is gone stops
the build.
"""
from __future__ import annotations

import re
from pathlib import Path

INCLUDE = re.compile(r'^--8<-- "README\.md:([\w-]+)"$', re.M)


def _section(readme: str, name: str) -> str:
    found = re.search(rf"<!-- --8<-- \[start:{name}\] -->\n(.*?)<!-- --8<-- \[end:{name}\] -->", readme, re.S)
    if found is None:
        raise ValueError(f"README.md has no section {name!r} for the home page to include")
    return re.sub(r"\]\(docs/", "](", found[1])


def on_page_markdown(markdown: str, page, config, **kwargs) -> str:
    if INCLUDE.search(markdown) is None:
        return markdown
    readme = (Path(config.config_file_path).parent / "README.md").read_text()
    return INCLUDE.sub(lambda match: _section(readme, match[1]), markdown)
