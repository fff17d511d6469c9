"""The README and docs/ stay navigable and true to the scripts: every relative link resolves, every option
the commands there give is one the script takes, and the README stays short."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target ends at whitespace or ")" (an optional "title" may follow)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text):
    """The lines of a markdown text outside fenced code blocks."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield line


def github_slug(heading):
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_' (unicode too)
    return text.replace(" ", "-")


def anchors(path):
    """The set of anchors GitHub generates for path's headings (repeated slugs get -1, -2, ...)."""
    seen, result = {}, set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def relative_links(path):
    """Every relative link target in path, outside code blocks and inline code."""
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)
        for target in LINK.findall(line) + HTML_SRC.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
                continue  # http:, https:, mailto: ...
            yield target


def test_github_slug_matches_githubs_rules():
    assert github_slug("Quick start (offline, CPU, about a minute)") == "quick-start-offline-cpu-about-a-minute"
    assert github_slug("Cost of each variant: `bench_model.py`") == "cost-of-each-variant-bench_modelpy"
    assert github_slug("CPU speed against NanoGPT's quick start") == "cpu-speed-against-nanogpts-quick-start"
    assert github_slug("Parameters at the GPT-2 124M shape") == "parameters-at-the-gpt-2-124m-shape"


def test_links_are_found_outside_code():
    assert list(relative_links(REPO / "README.md")), "the README should link to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"broken links in {page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_docs_folder_has_the_moved_pages():
    for name in ("training", "data", "sampling", "hellaswag", "benchmarks"):
        page = REPO / "docs" / f"{name}.md"
        assert page.exists(), f"docs/{name}.md is missing"
        assert f"docs/{name}.md" in {t.partition("#")[0] for t in relative_links(REPO / "README.md")}, \
            f"docs/{name}.md is not linked from the README"


def test_readme_is_short():
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines; keep it under {README_MAX_LINES} and move detail to docs/"


# `python X.py ... --opt` (or torchrun ... X.py --opt) in the README and docs/, in code blocks and inline code
COMMAND = re.compile(r"(?:python|torchrun)\b[^`]*?\b((?:bench/)?\w+\.py)\b([^`|;&#]*)")
TORCHRUN_OPTIONS = {"standalone", "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port"}


def script_options(script):
    """The --options a script's argparse parser declares, read from its source (no import, no torch);
    sample.py and eval_hellaswag.py take checkpoint.py's add_model_arguments too."""
    sources = [REPO / script] + [REPO / "checkpoint.py"] * ("add_model_arguments(" in (REPO / script).read_text())
    names = {n for path in sources for n in re.findall(r"add_argument\(\s*[\"']--([\w-]+)", path.read_text())}
    return names | {f"no-{n}" for n in names} | {"help"}  # --no-x: argparse's BooleanOptionalAction


def test_documented_command_options_exist():
    from configurator import DEFAULT_CONFIG

    passes_config_keys = {"train.py", "compare.py", "bench/bench_train.py"}  # --key=value goes on to train.py
    unknown = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for script, rest in COMMAND.findall(line):
                if not (REPO / script).is_file():
                    continue  # a test file or another repository's script
                known = script_options(script) | (set(DEFAULT_CONFIG) if script in passes_config_keys else set())
                known |= TORCHRUN_OPTIONS if script == "train.py" else set()
                rest = re.sub(r"\"[^\"]*\"|'[^']*'", "", rest)  # quoted values: --launcher="torchrun --standalone"
                unknown += [f"{page.relative_to(REPO)}:{number}: {script} --{option}"
                            for option in re.findall(r"(?<![\w-])--([\w-]+)", rest) if option not in known]
    assert not unknown, "options the docs give that the scripts do not take:\n" + "\n".join(unknown)
