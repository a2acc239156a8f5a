"""The timeline page of a real run, drawn by a real browser (headless Chromium), checked pixel by pixel:
every part and rank phase shows its legend colour where the SVG says it is, and the end markers are
drawn (issue #31 item 2). Skipped when Chromium is absent, unless ``LAUNCHER_REQUIRE_BROWSER=1`` (CI)."""

import os
import shutil
import struct
import subprocess
import tempfile
import zlib

import pytest

from launcher.monitoring.timeline import COLORS
from tests.helpers.launch import Launcher, cli
from tests.unit.monitoring.test_timeline import drawn

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
UNKNOWN = {(0xE0, 0xE0, 0xE0), (0x9E, 0x9E, 0x9E)}  # the hatch pattern's two colours


def _grey_between(pixel, dark, light) -> bool:
    """A neutral grey (channels within 6 of each other) between the hatch's two greys."""
    return max(pixel) - min(pixel) <= 6 and dark[0] <= min(pixel) and max(pixel) <= light[0]


def png_pixels(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and not interlace, header
    bpp = 4 if color == 6 else 3
    raw, stride, rows, prev = zlib.decompress(b"".join(chunks)), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a, b, c = line[i - bpp] if i >= bpp else 0, prev[i], prev[i - bpp] if i >= bpp else 0
            pred = (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]
            line[i] = (line[i] + pred) & 0xFF
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def rgb(color):
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def screenshot(page, out):
    profile = tempfile.mkdtemp()
    try:
        subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--force-device-scale-factor=1", "--hide-scrollbars", f"--user-data-dir={profile}",
                        f"--screenshot={out}", "--window-size=1400,900", f"file://{page}"],
                       capture_output=True, timeout=120, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(not BROWSER and os.environ.get("LAUNCHER_REQUIRE_BROWSER") != "1",
                    reason="chromium is not installed (apt-get install chromium)")
def test_the_browser_draws_what_the_svg_says(tmp_path):
    job = Launcher(tmp_path)
    code = job.run(["--nproc-per-node", "4", "--max-restarts", "1"],
                   ["--fail-rank", "2", "--exit-code", "7", "--print-lines", "1", "--run-per-attempt", "2,1"])
    assert code == 0, job.stderr
    done = cli("report", job.run_dir)
    assert done.returncode == 0, done.stderr
    page = job.run_dir / "timeline.html"
    screenshot(page, tmp_path / "out.png")
    width, height, rows = png_pixels(tmp_path / "out.png")
    # Where the SVG sits on the page: the legend's first swatch (productive, at 4,6 in the SVG).
    green = rgb(COLORS["productive"])
    oy, ox = next((y, row.index(green)) for y, row in enumerate(rows) if green in row)
    ox, oy = ox - 4, oy - 6
    elements = drawn(page.read_text())
    checked = 0
    for e in elements:
        if e["data-kind"] not in ("part", "phase") or float(e["width"]) < 6:
            continue
        y = oy + float(e["y"]) + 9
        # The hatch of "unknown" alternates: any of its colours within a few pixels will do. Look at a
        # quarter, the middle and three quarters of the bar: a short one may carry its rank's end
        # marker or a failure ring on one of those points.
        xs = [ox + float(e["x"]) + float(e["width"]) * share for share in (0.25, 0.5, 0.75)]
        seen = {rows[int(y)][int(x) + dx] for x in xs for dx in range(-3, 4)}
        if e["data-part"] == "unknown":
            # The hatch is drawn anti-aliased: on a short bar its two greys blend, so any grey between
            # them will do (every other part's colour is saturated).
            assert seen & UNKNOWN or any(_grey_between(pixel, *sorted(UNKNOWN)) for pixel in seen), (e, seen)
        else:
            assert rgb(COLORS[e["data-part"]]) in seen, (e, seen)
        checked += 1
    assert checked >= 8
    ends = [e for e in elements if e["data-kind"] == "end"]
    assert {e["data-state"] for e in ends} == {"failed", "stopped", "succeeded"}
    for e in ends:  # the marker's own ink at its place: red for failed, near-black for the others
        x, y = ox + round(float(e["data-x"])), oy + round(float(e["data-y"]))
        ink = [rows[y + dy][x + dx] for dy in range(-6, 7) for dx in range(-7, 7)]
        if e["data-state"] == "failed":
            assert any(r > 0xA0 and g < 0x40 and b < 0x40 for r, g, b in ink), e
        else:
            assert any(max(p) < 0x28 for p in ink), e
    assert (height, width) == (900, 1400)
