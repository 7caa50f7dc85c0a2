"""Git's clean filter for ``notebooks/*.ipynb`` (``.gitattributes``; ``make lab`` and ``make test``
configure it in the checkout): a notebook on stdin, the same without outputs on stdout, in
nbformat's own layout (one-space indent, sorted keys), so that a stripped notebook passes through
unchanged. What is stripped: ``krex_lab.shipped_notebooks.strip``.

    python3 notebooks/strip_outputs.py < NOTEBOOK.ipynb
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # git runs it with the system's python3

from krex_lab.shipped_notebooks import strip


def main() -> int:
    text = sys.stdin.read()
    try:
        nb = json.loads(text)
    except ValueError:  # not a notebook (a merge in progress): passed through untouched
        sys.stdout.write(text)
        return 0
    sys.stdout.write(json.dumps(strip(nb), sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
