"""The README's picture of a report: a recorded session of this repository's example, rendered by headless
Chromium into a PNG.

    .venv/bin/python docs/make_screenshot.py            # sample_runs/conv_classifier → docs/images/report.png

The report is written anew with `advisor report` (so the picture follows the templates as they are now),
from the session that `advisor profile examples/conv_classifier.py:train_step` recorded in sample_runs/;
nothing is run again. The paths of the machine it was recorded on (its checkout) are written relative to the
checkout in a copy first, so that the picture shows `examples/conv_classifier.py`, not a machine's folders.
The PNG is reduced to a palette of 256 colours to stay small (< 300 KB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "sample_runs" / "conv_classifier"
PICTURE = ROOT / "docs" / "images" / "report.png"
# The top of the page: the verdict and the ladder, whole (the table of every trial is wider than a picture).
WIDTH, HEIGHT = 1200, 820


def without_machine_paths(session: Path, copy: Path) -> Path:
    """A copy of the session whose paths under the checkout it was recorded in are relative to it."""
    shutil.copytree(session, copy)
    checkout = json.loads((copy / "session.json").read_text()).get("cwd")
    if not checkout:
        return copy
    for record in [copy / "session.json", *copy.glob("trials/*/trial.json")]:
        text = record.read_text().replace(json.dumps(checkout + "/")[1:-1], "")
        record.write_text(text.replace(f'"{checkout}"', '"."'))
    return copy


def render(session: Path, html: Path) -> None:
    """Write the session's report with the advisor's own `advisor report`."""
    from advisor.cli import main

    if main(["report", str(session), "-o", str(html)]) != 0:
        sys.exit(f"{session}: advisor report failed")


def screenshot(html: Path, png: Path, chromium: str) -> None:
    """Headless Chromium's picture of the page, at WIDTH × HEIGHT."""
    with tempfile.TemporaryDirectory() as profile:  # a profile of its own: never the user's browser state
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--no-first-run", "--disable-background-networking", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
                        f"--screenshot={png}", html.as_uri()],
                       check=True, capture_output=True, timeout=120)


def shrink(png: Path, out: Path) -> None:
    """The picture with a 256-colour palette (the report is flat colours and text: nothing visible is lost)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.open(png).convert("RGB").quantize(colors=256).save(out, optimize=True)


def main() -> None:
    """Render the session's report and save its picture."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", type=Path, default=SESSION, help="a session folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=PICTURE, help="the PNG (default: %(default)s)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        sys.exit("make_screenshot.py: no Chromium on the PATH (.ci/run installs it: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        html, png = Path(tmp) / "report.html", Path(tmp) / "report.png"
        render(without_machine_paths(args.session, Path(tmp) / "session"), html)
        screenshot(html, png, chromium)
        shrink(png, args.out)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
