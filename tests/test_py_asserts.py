#!/usr/bin/env python3
"""test_py_asserts.py - no plain `assert` statement in the Python tests or their references.

`python -O` removes assert statements, and with them the checks they made; the tests use
pstest.check / pstest.require instead (issue 17). This parses every .py file under tests/
and names each assert it finds. Exit 0 pass, 1 fail.
"""
import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, verdict  # noqa: E402


def main():
    root = os.path.dirname(os.path.abspath(__file__))
    files = 0
    for d, _, names in os.walk(root):
        for n in sorted(names):
            if not n.endswith(".py"):
                continue
            path = os.path.join(d, n)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            files += 1
            for node in ast.walk(tree):
                if isinstance(node, ast.Assert):
                    check(False, f"{os.path.relpath(path, root)}:{node.lineno}: plain assert (python -O removes it): "
                                 "use pstest.check or pstest.require")
    check(files >= 20, f"only {files} Python files found under {root}")
    return verdict(f" ({files} files)")


if __name__ == "__main__":
    sys.exit(main())
