"""`python -m bench.profile FILE [--per N]`: where the operator's samples went, from py-spy's
collapsed stacks (written by `bench.compensation --profile DIR`): the leaf functions that took
the most samples, and the share of each part of the stack (the first frame, from the leaf up,
in a package of interest), per compensation when `--per` gives how many there were."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# A frame is "function (path:line)". A sample under the participant transport is a participant
# call's, whatever it ran (aiohttp, TLS, the event loop); any other is named by the first of
# these that matches from the leaf up.
PARTICIPANT_CALLS = ("participant calls (undolog.calls.http, aiohttp)", re.compile(r"undolog/calls/http\.py"))
PARTS = (
    ("TLS", re.compile(r"/ssl\.py|sslproto")),
    ("undolog.kube (API client)", re.compile(r"undolog/kube/")),
    ("aiohttp", re.compile(r"aiohttp/")),
    ("pydantic (parsing, dumping)", re.compile(r"pydantic")),
    ("kopf", re.compile(r"kopf/")),
    ("json", re.compile(r"/json/")),
    ("undolog", re.compile(r"undolog/")),
    ("asyncio event loop", re.compile(r"asyncio/")),
)


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def part_of(frames: list[str]) -> str:
    name, pattern = PARTICIPANT_CALLS
    if any(pattern.search(frame) for frame in frames):
        return name
    for frame in reversed(frames):
        for name, pattern in PARTS:
            if pattern.search(frame):
                return name
    return "other"


def report(path: Path, per: int, rate: int) -> str:
    stacks = parse(path)
    total = sum(count for _, count in stacks)
    leaves: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    for frames, count in stacks:
        leaves[frames[-1]] += count
        parts[part_of(frames)] += count
    ms = 1000 / rate
    lines = [f"{path.name}: {total} samples at {rate} Hz = {total * ms:.0f} ms of operator time"]
    if per:
        lines.append(f"per compensation: {total * ms / per:.2f} ms ({per} compensations)")
    lines.append("share by part:")
    lines += [f"  {count / total:6.1%}  {name}" for name, count in parts.most_common()]
    lines.append("top leaf functions:")
    lines += [f"  {count / total:6.1%}  {frame[:110]}" for frame, count in leaves.most_common(12)]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--per", type=int, default=0, help="compensations the profile covers")
    parser.add_argument("--rate", type=int, default=250, help="samples per second it was taken at")
    options = parser.parse_args()
    print(report(options.file, options.per, options.rate))
