"""MkDocs hook: the repository's CHANGELOG.md as the site's page changelog.md.

MkDocs reads only docs/, and the changelog belongs at the repository root, where contributors
edit it and the sdist ships it; the site gets the same text at build time. Its links are written
from the root (``docs/reference/x.md``): here they are made relative to docs/.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    text = (Path(config["docs_dir"]).parent / "CHANGELOG.md").read_text()
    files.append(File.generated(config, "changelog.md", content=re.sub(r"\]\(docs/", "](", text)))
    return files
