"""The documentation: the site builds with --strict and no warning, its command-line reference is the parser's,
every flag the README's and the site's command examples use exists, and the README stays a short page."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, require

from advisor.cli import build_parser

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
from cli_reference import subcommands  # noqa: E402  (the site's hook: the parser's sub-commands by name)

PAGES = sorted((ROOT / "docs").rglob("*.md"))
README = ROOT / "README.md"
README_LINES = 150  # read in three minutes
SCREEN = 40  # lines of a README section: one screen


def test_the_site_builds_strictly_with_the_parsers_options(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its successor
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-3000:]
    pages = {p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")}
    expected = {p.relative_to(ROOT / "docs").with_suffix("").as_posix().removesuffix("/index").removesuffix("index")
                for p in PAGES}
    assert {"." if e == "" else e for e in expected} <= pages, sorted(expected - pages)
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for name, (sub, _) in subcommands(build_parser()).items():
        flags = [f for a in sub._actions for f in a.option_strings if f not in ("-h", "--help")]
        assert f"advisor {name}" in cli and all(f in cli for f in flags), name
    api = (site / "reference" / "api" / "index.html").read_text()
    assert all(f'id="advisor.api.{name}"' in api for name in ("analyze", "profile", "tune", "Session"))
    schema = (site / "traces" / "index.html").read_text()
    assert "advisor.analysis/1" in schema and "straggler" in schema  # the schema, from analyze.py's docstring


def code_blocks(text: str) -> list[str]:
    """The lines of every fenced code block, backslash continuations joined."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def command_examples(path: Path) -> list[tuple[str, bool]]:
    """`advisor ...` command lines of a page, without a prompt or comment, each with whether it is a code
    block's whole line (an example as run) rather than inline code (often a synopsis)."""
    text = path.read_text()
    lines = [(line, True) for line in code_blocks(text)]
    lines += [(span, False) for span in re.findall(r"`((?:\.venv/bin/)?advisor [^`]+)`", text)]
    commands = []
    for line, whole in lines:
        line = line.strip().removeprefix("$ ")
        # A command, not a line of output ("advisor doctor: device cpu").
        if re.match(r"(\.venv/bin/)?advisor (analyze|compare|profile|lint|report|doctor)(\s|$)", line):
            commands.append((line.split(" #")[0].strip(), whole))
    return commands


def make_targets(path: Path) -> list[str]:
    """The `make TARGET` lines of a page's code blocks."""
    return [m[1] for line in code_blocks(path.read_text()) if (m := re.match(r"\s*(?:\$ )?make ([\w-]+)", line))]


def test_command_examples_use_flags_that_exist():
    """Each example's options are the sub-command's; an example without placeholders parses as it stands."""
    parser = build_parser()
    commands = {name: sub for name, (sub, _) in subcommands(parser).items()}
    checked, wrong = 0, []
    for path in [README, *PAGES]:
        for example, whole in command_examples(path):
            words = shlex.split(example.replace("|", " "))
            argv = words[1:words.index("--")] if "--" in words else words[1:]
            known = {f for a in commands[argv[0]]._actions for f in a.option_strings} | {"--debug"}
            flags = [w.strip("[]").split("=")[0] for w in argv[1:]
                     if re.fullmatch(r"\[?--?[a-z][-a-z]*(=\S*)?\]?", w)]  # not a quoted value ("--nnodes 2")
            wrong += [f"{path.name}: {example}: {f}" for f in flags if f not in known]
            placeholders = re.search(r"[][|<>]|\b[A-Z]+\b", example)
            if whole and not placeholders:
                try:
                    with contextlib.redirect_stderr(io.StringIO()) as error:
                        parser.parse_args(argv)
                except SystemExit:
                    wrong.append(f"{path.name}: {example}: {error.getvalue().strip()}")
            checked += 1
    assert checked > 20 and not wrong, wrong


def test_make_targets_in_examples_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    used = {t for path in [README, *PAGES] for t in make_targets(path)}
    assert {"install", "test", "demo", "docs", "gpu-check"} <= used and used <= targets, used - targets


def test_the_readme_is_a_short_page():
    """At most 150 lines, no section longer than a screen, its picture small and checked in, its links live."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES
    sections = re.split(r"^## ", text, flags=re.M)
    long = {s.splitlines()[0]: len(s.splitlines()) for s in sections[1:] if len(s.splitlines()) > SCREEN}
    assert not long, long
    picture = ROOT / re.search(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)[1]
    assert picture.stat().st_size < 300_000 and picture.read_bytes()[:4] == b"\x89PNG"
    links = [ROOT / target for target in re.findall(r"\]\(([^)#:]+)\)", text)]
    assert len(links) > 10 and all(link.exists() for link in links), [str(p) for p in links if not p.exists()]


def test_the_readme_picture_is_made_again_from_a_recorded_session(tmp_path):
    """docs/make_screenshot.py renders sample_runs/' session with `advisor report` and headless Chromium."""
    from PIL import Image

    require("chromium")
    out = tmp_path / "report.png"
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "make_screenshot.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    image = Image.open(out)
    assert image.size == (1200, 820) and out.stat().st_size < 300_000
    # The session's copy holds no path of the machine it was recorded on: the picture shows none.
    sys.path.insert(0, str(ROOT / "docs"))
    from make_screenshot import SESSION, without_machine_paths

    checkout = json.loads((SESSION / "session.json").read_text())["cwd"]
    copy = without_machine_paths(SESSION, tmp_path / "copy")
    assert all(checkout not in p.read_text() for p in [copy / "session.json", *copy.glob("trials/*/trial.json")])
    assert json.loads((copy / "session.json").read_text())["script"] == "examples/conv_classifier.py"
    # Not a blank page: the report's light background and its dark text and coloured badges both show.
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 20


def test_every_knob_has_a_line_in_the_readme_and_its_module_on_the_knobs_page():
    """A knob is named in the README's list, and docs/knobs.md renders each knob's module (its reference text)
    once, in the registry's order (the site's hook puts them where the page asks): what a knob does is written
    in one place."""
    from knob_sections import MARKER, on_page_markdown
    from lists import lists_after_paragraphs

    from advisor.knobs import KNOBS

    listed = re.search(r"^## What it changes\n(.*?)^## ", README.read_text(), re.S | re.M)[1]
    in_readme = set(re.findall(r"^- (.*)$", listed, re.M))
    page = (ROOT / "docs" / "knobs.md").read_text()
    assert page.count(MARKER) == 1 and not re.search(r"^## `", page, re.M), "a knob's section written on the page"
    rendered = on_page_markdown(page, None, None, None)
    assert re.findall(r"^::: advisor\.knobs\.(\w+)$", rendered, re.M) == [knob.name for knob in KNOBS]
    for knob in KNOBS:
        assert any(f"`{knob.name}`" in line.split(":")[0] for line in in_readme), knob.name
        text = sys.modules[f"advisor.knobs.{knob.name}"].__doc__
        assert text.startswith(f"`{knob.name}`: "), knob.name
        assert not lists_after_paragraphs(text), knob.name  # the hook sees the page, not the docstrings


def test_no_list_renders_as_a_paragraph():
    """A list right after a paragraph line (no blank line) is one paragraph to Python-Markdown: the build's hook
    (docs/hooks/lists.py) warns, which fails --strict; every page passes it, and it finds the mistake."""
    from lists import lists_after_paragraphs

    assert not {str(p.relative_to(ROOT)): found for p in PAGES if (found := lists_after_paragraphs(p.read_text()))}
    page = "Intro:\n- one\n- two\n\nAfter a blank:\n\n- three\n  carried on\n- four\n\n```\ntext\n- in code\n```\n"
    assert lists_after_paragraphs(page) == [(2, "- one")]


def test_help_and_docs_name_the_distribution():
    """`advisor` on PyPI is another project: every install line names torch-advisor, or a checkout."""
    parser = build_parser()
    profile = subcommands(parser)["profile"][0]
    assert "pip install torch-advisor" in parser.format_help()
    assert "pip install 'torch-advisor[ray]'" in " ".join(profile.format_help().split())
    lines = [line for path in [README, *PAGES] for line in path.read_text().splitlines() if "pip install" in line]
    assert not [line for line in lines if re.search(r"pip install\s+'?advisor\b", line)], lines
    assert "torch-advisor" in (ROOT / "docs" / "installing.md").read_text()
