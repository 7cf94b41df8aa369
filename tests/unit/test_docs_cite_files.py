"""The project cites only files it holds: docs' links and paths, and docs/ pages cited anywhere."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = ("minidp", "docs", "tests", "examples", "benchmarks")
# Paths of other projects that a page names as theirs (docs/daso.md: Heat's own example).
ELSEWHERE = {"examples/nn/imagenet-DASO.py"}
PLACEHOLDER = re.compile(r"[A-Z]{2,}")  # docs/NAME.md: one page per strategy, by name


def tracked(suffixes):
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [n for n in names if n.endswith(suffixes) and os.path.exists(os.path.join(ROOT, n))]


def missing(cited, base):
    return not os.path.exists(os.path.join(base, cited)) and cited not in ELSEWHERE \
        and not PLACEHOLDER.search(os.path.basename(cited))


def test_links_and_paths_in_the_docs_exist():
    bad = []
    for name in tracked((".md",)):
        text = open(os.path.join(ROOT, name)).read()
        for link in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+:", link) and missing(link, os.path.dirname(
                    os.path.join(ROOT, name))):
                bad.append((name, link))
        for path in re.findall(rf"`((?:{'|'.join(FOLDERS)})/[\w./-]+)`", text):
            if missing(path.rstrip("/."), ROOT):
                bad.append((name, path))
    assert not bad


def test_every_docs_page_cited_in_the_code_exists():
    bad = []
    for name in tracked((".py", ".md", ".cfg", ".toml", "Makefile", ".sbatch")):
        text = open(os.path.join(ROOT, name)).read()
        bad += [(name, page) for page in re.findall(r"docs/[\w/.-]+?\.md", text)
                if missing(page, ROOT)]
    assert not bad
