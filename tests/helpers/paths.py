"""Where the repository and the tests' data files are, for tests at any depth."""

from pathlib import Path

#: The repository's root (the directory holding ``launcher/`` and ``tests/``).
REPO = Path(__file__).resolve().parents[2]
#: ``tests/data``: rank tables, the malformed-input corpus, restore fixtures, manifests.
DATA = REPO / "tests" / "data"
