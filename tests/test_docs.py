"""The README and docs/ stay true to the repo: every relative link resolves, every command they
show runs a script that is here with options it takes, and the README stays short."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES, MAX_LINE_CHARS = 180, 100

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
# `python X.py --opt` or `torchrun ... X.py --opt`, in code blocks and inline code
COMMAND = re.compile(r"(?:python|torchrun)\b[^`|;&#]*?([\w./-]+\.py)\b([^`|;&#]*)")


def prose_lines(path):
    """The lines of a page outside fenced code blocks."""
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
        elif not inside:
            yield line


def anchors(path):
    """GitHub's anchors for a page's headings: markup and punctuation dropped, spaces to '-'."""
    headings = (m.group(1) for m in map(HEADING.match, prose_lines(path)) if m)
    headings = (re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", h) for h in headings)  # links' text
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for line in prose_lines(page):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^([a-z][a-z0-9+.-]*:|//)", target, re.IGNORECASE):
                continue  # http:, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(target)
    assert not broken, f"broken links in {page.name}: {broken}"


def script_options(script):
    """The --options a script's parser declares (checkpoint.py's add_model_arguments too)."""
    text = (REPO / script).read_text()
    text += (REPO / "checkpoint.py").read_text() if "add_model_arguments(" in text else ""
    names = set(re.findall(r"\(\s*[\"']--([\w-]+)[\"']", text))  # add_argument("--x", or an alias
    return names | {f"no-{n}" for n in names} | {"help"}  # --no-x: BooleanOptionalAction


def test_documented_commands_run_scripts_here_with_options_they_take():
    from configurator import DEFAULT_CONFIG
    passes_keys = {"train.py", "compare.py", "bench/bench_train.py"}  # --key=value on to train.py
    wrong = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for script, rest in COMMAND.findall(line):
                rest = re.sub(r"\"[^\"]*\"|'[^']*'", "", rest)  # quoted: --launcher="torchrun ..."
                files = [script, *re.findall(r"config/\w+\.py", rest)]
                wrong += [f"{page.name}:{number}: no {f}" for f in files if not (REPO / f).exists()]
                if not (REPO / script).is_file():
                    continue
                known = script_options(script)
                known |= set(DEFAULT_CONFIG) if script in passes_keys else set()
                wrong += [f"{page.name}:{number}: {script} --{option}" for option in
                          re.findall(r"(?<![\w-])--([\w-]+)", rest) if option not in known]
    assert not wrong, "commands in the docs that would fail:\n" + "\n".join(wrong)


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    long = [n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert len(lines) <= README_MAX_LINES and not long, \
        f"README.md: {len(lines)} lines, over {MAX_LINE_CHARS} characters: lines {long}"
