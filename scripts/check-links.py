#!/usr/bin/env python3
"""Every relative link in the Markdown pages (README, CONTRIBUTING, CHANGELOG, docs/) points at a
file that exists, and every #anchor at a heading of that page (GitHub's slugs).

usage: scripts/check-links.py   (from anywhere; exits 1 and names each broken link)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def pages():
    for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md"):
        yield os.path.join(ROOT, name)
    for dirpath, _, files in os.walk(os.path.join(ROOT, "docs")):
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(dirpath, f)


def main():
    bad = []
    for page in pages():
        with open(page, encoding="utf-8") as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            rel = os.path.relpath(page, ROOT)
            if not os.path.exists(dest):
                bad.append(f"{rel}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel}: {target}: no such heading")
    for b in bad:
        print("check-links:", b)
    print(f"check-links: {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
