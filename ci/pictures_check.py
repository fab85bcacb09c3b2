#!/usr/bin/env python3
"""Checks the pictures ci/pictures.sh made.

--dom: the timeline page's DOM as Chromium rendered it (after its script ran): the SVG
exists, with a lane per host, a fault's shade over a lane and its bar, calls coloured by
outcome, and a missed deadline drawn red with its violation's text.
--screenshot: a PNG of the page, not blank.
--plot FILE NAMES: an SVG that parses, whose every panel holds exactly one curve for
each of the comma-separated series NAMES, and at least one deadline line.
"""

import argparse
import struct
import sys
import xml.etree.ElementTree as ET
import zlib
from html.parser import HTMLParser

SVG = "{http://www.w3.org/2000/svg}"


class Elements(HTMLParser):
    """Every element's tag, classes and data attributes, and each missed-text's text."""

    def __init__(self):
        super().__init__()
        self.elements = []
        self.missed_texts = []
        self._in_missed = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        self.elements.append((tag, classes, attrs))
        self._in_missed = "missed-text" in classes

    def handle_endtag(self, tag):
        self._in_missed = False

    def handle_data(self, data):
        if self._in_missed:
            self.missed_texts.append(data)


def check_dom(path):
    parser = Elements()
    with open(path, encoding="utf-8") as f:
        parser.feed(f.read())
    els = parser.elements
    problems = []

    def having(cls, tag=None):
        return [e for e in els if cls in e[1] and (tag is None or e[0] == tag)]

    if not [e for e in els if e[0] == "svg" and e[2].get("id") == "timeline"]:
        problems.append("no <svg id=timeline>: the page's script did not draw")
    lanes = {e[2].get("data-lane") for e in having("lane", "g")}
    for expected in ("operator", "kube-api"):
        if expected not in lanes:
            problems.append(f"no lane for {expected} (lanes: {sorted(lanes)})")
    if not any(lane and lane.startswith("spurctld") for lane in lanes):
        problems.append("no controller replica lane")
    shades = having("fault", "rect")
    if not any(e[2].get("data-fault") == "leader-kill-silent" for e in shades):
        problems.append("no shade of the leader-kill-silent fault over a lane")
    if not having("fault-bar", "rect"):
        problems.append("no fault bar")
    outcomes = {c for e in having("call", "rect") for c in e[1] if c not in ("call", "clickable")}
    for expected in ("answered", "transport"):
        if expected not in outcomes:
            problems.append(f"no call drawn as {expected} (drawn: {sorted(outcomes)})")
    missed = [e for e in els if e[0] == "g" and "deadline" in e[1] and "missed" in e[1]]
    if not missed:
        problems.append("no missed deadline drawn")
    elif not any("submission" in t and "no spurJobId" in t for t in parser.missed_texts):
        problems.append(f"the missed deadline does not show its violation: {parser.missed_texts}")
    if not having("met", "g"):
        problems.append("no met deadline drawn")
    return problems, f"{len(lanes)} lanes, {len(shades)} fault shade(s), {len(missed)} missed deadline(s), calls {sorted(outcomes)}"


def check_png(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return ["not a PNG"], ""
    width, height = struct.unpack(">II", data[16:24])
    # Decompress the image data: a blank page would be one colour throughout.
    pos, idat = 8, b""
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    distinct = len(set(raw[i:i + 3] for i in range(0, min(len(raw), 4_000_000), 7)))
    problems = []
    if distinct < 16:
        problems.append(f"the screenshot looks blank ({distinct} distinct samples)")
    return problems, f"{width}x{height}, {distinct} distinct samples"


def check_plot(path, names):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return [f"does not parse: {e}"], ""
    panels = [g for g in root.iter(SVG + "g") if g.get("class") == "panel"]
    problems = []
    if not panels:
        problems.append("no panel")
    for panel in panels:
        series = [p.get("data-series") for p in panel.iter(SVG + "path") if p.get("class") == "cdf"]
        if sorted(series) != sorted(names):
            problems.append(f"panel {panel.get('data-metric')}: curves {series}, expected one each of {names}")
    deadlines = [l for l in root.iter(SVG + "line") if l.get("class") == "deadline"]
    if not deadlines:
        problems.append("no deadline line")
    return problems, f"{len(panels)} panels, series {names}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dom")
    parser.add_argument("--screenshot")
    parser.add_argument("--plot", nargs=2, action="append", default=[], metavar=("FILE", "NAMES"))
    args = parser.parse_args()
    failed = False
    checks = [(args.dom, check_dom, ()), (args.screenshot, check_png, ())]
    checks = [c for c in checks if c[0]]
    checks += [(path, check_plot, (names.split(","),)) for path, names in args.plot]
    for path, check, extra in checks:
        problems, summary = check(path, *extra)
        for p in problems:
            print(f"pictures: {path}: {p}", file=sys.stderr)
        failed |= bool(problems)
        if not problems:
            print(f"pictures: {path}: ok ({summary})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
