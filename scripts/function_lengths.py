#!/usr/bin/env python3
"""Lists the C++ functions longer than a limit, to keep a folder's functions short enough to
read whole (src/ and tools/ are held to 80 lines: ctest FunctionsShort).

Usage: scripts/function_lengths.py LIMIT FILE_OR_FOLDER ...
Prints "file:line: N lines: signature" for every function body longer than LIMIT lines
(from its opening to its closing brace) and exits 1 if there is one, else 0.

It reads the code as text: comments and literals are blanked, and a brace opens a
function body when the text before it (since the last ';', '{' or '}') looks like a
signature: it holds a parameter list and is no control statement, lambda, type or
initializer. Lambdas and local classes count as part of the function around them.
"""
import os
import re
import sys

CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|try|return|namespace|class|struct|union|enum)\b")


def blank_comments_and_literals(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def looks_like_signature(header):
    h = " ".join(header.split())
    if "(" not in h or CONTROL.match(h) or h.startswith("#"):
        return False
    before_params = h[: h.find("(")]
    if "=" in before_params or re.search(r"\]\s*$", before_params) or "[" in before_params:
        return False  # an initializer, or a lambda
    return True


def long_functions(path, limit):
    text = blank_comments_and_literals(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []  # per open brace: (line of '{', is a function body, signature)
    header_start = 0
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == ";":
            header_start = i + 1
        elif c == "{":
            header = text[header_start:i]
            inside_function = any(f for _, f, _ in stack)
            is_function = not inside_function and looks_like_signature(header)
            stack.append((line, is_function, " ".join(header.split())[:100]))
            header_start = i + 1
        elif c == "}":
            if stack:
                start, is_function, signature = stack.pop()
                if is_function and line - start + 1 > limit:
                    found.append((start, line - start + 1, signature))
            header_start = i + 1
    return found


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    limit = int(sys.argv[1])
    paths = []
    for arg in sys.argv[2:]:
        if os.path.isdir(arg):
            for root, _, files in os.walk(arg):
                paths += [os.path.join(root, f) for f in sorted(files) if f.endswith((".h", ".cpp", ".inc"))]
        else:
            paths.append(arg)
    bad = 0
    for path in sorted(paths):
        for start, length, signature in long_functions(path, limit):
            print(f"{path}:{start}: {length} lines: {signature}")
            bad += 1
    if bad:
        print(f"{bad} function(s) longer than {limit} lines")
        return 1
    print(f"no function longer than {limit} lines in {len(paths)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
