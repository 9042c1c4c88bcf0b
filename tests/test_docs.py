"""The docs are reference: README.md and docs/*.md describe the system as it is, and the result files
they cite are in the repository.

History (revision hashes, issue numbers, dated narratives) lives in git; a doc that names a result
file in ``benchmarks/results/`` names one that exists, and that folder keeps only what the docs cite.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_RESULT_FILES = 60

# A revision: 40 hex digits, or 7 and more with at least one digit and one letter a-f (a plain number or
# an English word such as "defaced" is neither).
REVISION = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
ISSUE = re.compile(r"\bissues?[\s#-]*\d{1,3}\b", re.IGNORECASE)
# An ISO date (2026-11-29) is a diary's: a result file holds when it was measured, the docs say what
# holds now. Result file names (ycsbt-sweep-20261201-190249.json) carry no dashes inside the date.
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# A diary's "this session" (pytest's session, which the docs also name, is left alone).
SESSION = re.compile(r"\bthis session\b|\bthe session's (start|starting|first|last|runs?)\b", re.IGNORECASE)

# A result file named in a doc: a link or a path into benchmarks/results/, or a result file's own name
# in backquotes (the tables name their sweep files so).
RESULT_PATH = re.compile(r"benchmarks/results/([\w./-]*[\w/])")
RESULT_NAME = re.compile(r"`([\w.-]+-\d{8}-\d{6}[\w.-]*\.(?:json|png))`")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def findings(pattern: re.Pattern[str], text: str) -> list[str]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            out.append(f"line {number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
@pytest.mark.parametrize(
    ("what", "pattern"),
    [("revision hash", REVISION), ("issue number", ISSUE), ("date", DATE), ("session", SESSION)],
    ids=["revision", "issue", "date", "session"],
)
def test_no_history_in_the_docs(doc: Path, what: str, pattern: re.Pattern[str]) -> None:
    found = findings(pattern, doc.read_text())
    assert not found, f"{doc_id(doc)} tells history ({what}; git keeps it):\n" + "\n".join(found)


def test_the_history_patterns_catch_what_they_are_for() -> None:
    diary = (
        "revision `32356ca` (before: 0605ecb3a), see issue 15 and issue15-lean.md, Issue #42;"
        " before 2026-11-29, since 2026-12-01; this session's runs, the session's starting revision"
    )
    assert REVISION.findall(diary) == ["32356ca", "0605ecb3a"]
    assert len(ISSUE.findall(diary)) == 3
    assert DATE.findall(diary) == ["2026-11-29", "2026-12-01"]
    assert SESSION.findall(diary)
    reference = (
        "1000000 requests, 2 000/s, 0x10, a defaced cafe, 10 000 accounts, the issues it finds,"
        " `ycsbt-sweep-20261201-190249.json`, tissue 12, fixtures shared by the session"
    )
    for pattern in (REVISION, ISSUE, DATE, SESSION):
        assert not pattern.findall(reference), pattern


def cited_results(doc: Path) -> set[Path]:
    text = doc.read_text()
    cited = {RESULTS / m.rstrip("/.") for m in RESULT_PATH.findall(text)}
    # Relative links from docs/ (../benchmarks/results/x) are caught by the path pattern above too.
    cited |= {RESULTS / name for name in RESULT_NAME.findall(text)}
    return cited


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_result_file_the_docs_cite_exists(doc: Path) -> None:
    missing = sorted(str(p.relative_to(ROOT)) for p in cited_results(doc) if not p.exists())
    assert not missing, f"{doc_id(doc)} cites result files that are not in the repository: {missing}"


def test_the_docs_cite_their_result_files() -> None:
    """The docs name the newest sweep of every workload (the results table's files)."""
    cited = set().union(*(cited_results(doc) for doc in DOCS))
    sweeps = {p.name.split("-sweep-")[0] for p in cited if "-sweep-" in p.name and p.suffix == ".json"}
    assert {"ycsbt", "tpcc", "deathstar-hotel", "deathstar-movie"} <= sweeps, sweeps


def result_files() -> list[str]:
    """The files of benchmarks/results/ in the repository: git's, since a local run writes more there
    (ignored, .gitignore); every file on disk when this is no git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", "benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(ROOT)) for p in RESULTS.rglob("*") if p.is_file()]
    return out.stdout.split()


def test_benchmarks_results_keeps_only_what_the_docs_cite() -> None:
    files = result_files()
    assert 0 < len(files) <= MAX_RESULT_FILES, f"{len(files)} files in benchmarks/results/"
    cited = set().union(*(cited_results(doc) for doc in DOCS))
    cited_dirs = {p for p in cited if p.is_dir()}
    uncited = [
        f for f in files if (ROOT / f) not in cited and not any(d in (ROOT / f).parents for d in cited_dirs)
    ]
    assert not uncited, f"result files no doc cites (git rm them, git keeps history): {uncited}"
