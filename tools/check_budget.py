"""File-size budget: no Python module in the packages may exceed MAX_LINES (STYLE.md, rule 13)."""

import pathlib
import sys

MAX_LINES = 400
PACKAGES = ("services", "shared", "policies", "core", "sim", "rl")


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    too_big = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            num_lines = len(path.read_text().splitlines())
            if num_lines > MAX_LINES:
                too_big.append(f"{path.relative_to(root)}: {num_lines} lines (limit {MAX_LINES})")
    for line in too_big:
        print(line)
    return 1 if too_big else 0


if __name__ == "__main__":
    sys.exit(main())
