"""The documentation's references resolve inside the repository, and the README stays short.

Users never see the reference material the project was built from, so a page or module that points
outside the repository (or at a file that moved) is a dead end for them.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/*/README.md"),
                ROOT / "bench" / "README.md"])
#: ``[text](target)``, not images' remote URLs; the target up to a space, ``)`` or ``#``.
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for match in LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_of_the_repository(page):
    missing = [t for t in _links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_nothing_points_outside_the_repository():
    offenders = []
    for path in [*PAGES, *ROOT.glob("launcher/**/*.py")]:
        if "shared/docs" in path.read_text(encoding="utf-8") or "ascend-contracts" in path.read_text(encoding="utf-8"):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in ROOT.glob("docs/*.md") if p.name != "README.md" and f"]({p.name})" not in index]
    assert unlisted == []


def test_the_readme_reads_in_five_minutes():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 200


def test_every_file_path_named_in_the_docs_exists():
    """Pages name tests and modules by path (`tests/unit/cluster/test_sync.py`); a moved file must
    take its mentions along."""
    named = re.compile(r"`((?:launcher|tests|bench|examples|schemas)/[\w./-]+\.(?:py|json|proto|yaml|md))`")
    missing = []
    for page in PAGES:
        for path in named.findall(page.read_text(encoding="utf-8")):
            if not (ROOT / path).exists() and not path.startswith("bench/results/"):  # generated, ignored
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []
