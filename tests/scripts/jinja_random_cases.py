#!/usr/bin/env python3
"""Random templates with jinja2's renderings, for differential testing of src/jinja.

Prints one JSON object per line: {"template": ..., "output": ...} or {"template": ...,
"error": KIND} (KIND as tests/scripts/chat_template_expectations.py maps exceptions).
Two families, drawn from a fixed seed so a run is reproducible:

  expressions  operators, filters, tests and methods combined at random over values of
               every type (strings with non-ASCII, numbers, lists, dicts, tuples, ranges,
               none, undefined, a namespace);
  statements   if / for / set / namespace / macro / block set / raw / comments nested at
               random, every whitespace-control combination around them and text with
               spaces, tabs and newlines between.

Usage: jinja_random_cases.py [--seed N] [--expressions N] [--statements N]
Exit status 77 when jinja2 is not installed.
"""

import argparse
import json
import random
import sys
import os
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_template_expectations as reference  # exits 77 without jinja2

# jinja2 warns about subscripting constants ("perhaps you missed a comma?") while compiling.
warnings.simplefilter("ignore", SyntaxWarning)

PRELUDE = (
    "{% set d = {'a': 1, 'b': 'two', 'c': [1, 2]} %}{% set l = [3, 1, 2] %}{% set s = 'Hello, World' %}"
    "{% set n = 7 %}{% set r = range(4) %}{% set t = (1, 'x', none) %}"
    "{% set ns = namespace(v=[{'a': 1}, {'a': 0}]) %}"
)
ATOMS = ["0", "1", "-3", "2.5", "1e-5", "0.1", "True", "false", "none", "'abc'", "'A b'", "''", "' x '", "'é😀'",
         "[1, 2, 3]", "[]", "['b', 'a', 'C']", "{'a': 1, 'b': [2]}", "{}", "(1, 'x')", "undefined_x", "d", "l", "s",
         "n", "ns.v", "r", "t", "range(4)", "'a,b,,c'", "'%s-%s'", "'{}|{}'"]
VARIABLES = ["d", "l", "s", "n", "ns.v", "undefined_x", "r", "t"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]
FILTERS = ["length", "first", "last", "list", "string", "upper", "lower", "title", "capitalize", "trim", "tojson",
           "sort", "unique|list", "reverse|list", "join(',')", "default('D')", "default('D', true)", "int", "float",
           "abs", "round", "sum", "min", "max", "select|list", "reject|list", "map('string')|list", "items|list",
           "dictsort", "batch(2)|list", "wordcount", "center(7)", "replace('a', 'Z')", "indent(2)",
           "truncate(4, true, '.', 0)", "safe", "e", "count", "tojson(indent=1)", "tojson(sort_keys=true)",
           "format(1, 2)", "select('odd')|list", "map('upper')|list", "selectattr('a')|list"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "callable", "odd", "even", "divisibleby 2", "in [1, 'abc']", "eq 1", "lower", "upper", "boolean", "true",
         "false", "sameas none"]
METHODS = ["split()", "split(',')", "strip()", "upper()", "startswith('a')", "endswith(('c', 'x'))",
           "replace('b', 'q')", "find('b')", "count('a')", "title()", "format(1, 2)", "rsplit(',', 1)", "lstrip('a')",
           "zfill(5)", "isdigit()", "get('a')", "items()|list", "keys()|list", "values()|list", "index(2)", "count(1)",
           "join(['x', 'y'])", "center(6, '*')"]
SUBSCRIPTS = ["0", "-1", "1:", "::-1", "a", "'a'", ":2"]


def expression(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.25:
        return rng.choice(ATOMS)
    if r < 0.45:
        return f"({expression(rng, depth + 1)} {rng.choice(OPERATORS)} {expression(rng, depth + 1)})"
    if r < 0.65:
        return f"{expression(rng, depth + 1)}|{rng.choice(FILTERS)}"
    if r < 0.75:
        negation = "not " if rng.random() < 0.3 else ""
        return f"({expression(rng, depth + 1)} is {negation}{rng.choice(TESTS)})"
    if r < 0.85:
        return f"{rng.choice(ATOMS)}.{rng.choice(METHODS)}"
    if r < 0.9:
        # Subscripts of variables only: jinja2 folds expressions made of literals when it
        # compiles, through a lookup that differs from run time for slices.
        return f"{rng.choice(VARIABLES)}[{rng.choice(SUBSCRIPTS)}]"
    if r < 0.95:
        return f"({expression(rng, depth + 1)} if {expression(rng, depth + 1)} else {expression(rng, depth + 1)})"
    return f"(not {expression(rng, depth + 1)})"


TEXT = ["a", "b", " ", "  ", "\n", "\t", " \n ", "\n\n", "x\n  ", "  \ny"]


def control(rng):
    return rng.choice(["", "-", "+"])


def tag(rng, body):
    return "{%" + control(rng) + " " + body + " " + control(rng) + "%}"


def text(rng):
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(0, 3)))


def statements(rng, depth=0):
    out = ""
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.3 or depth > 2:
            out += text(rng)
        elif r < 0.45:
            expr = rng.choice(["i", "x", "loop.index", "ns.c", "'v'", "m()", "y"])
            out += "{{" + rng.choice(["", "-"]) + " " + expr + " " + rng.choice(["", "-"]) + "}}"
        elif r < 0.55:
            out += tag(rng, "if " + rng.choice(["true", "false", "i is odd", "x"])) + statements(rng, depth + 1)
            if rng.random() < 0.5:
                out += tag(rng, "else") + statements(rng, depth + 1)
            out += tag(rng, "endif")
        elif r < 0.65:
            out += tag(rng, "for i in " + rng.choice(["[1, 2]", "range(3)", "[]", "'ab'"])) + statements(rng, depth + 1)
            if rng.random() < 0.3:
                out += tag(rng, "else") + statements(rng, depth + 1)
            out += tag(rng, "endfor")
        elif r < 0.72:
            out += tag(rng, "set x = " + rng.choice(["1", "'s'", "i|default(0)", "x ~ 'z'"]))
        elif r < 0.78:
            out += tag(rng, "set ns.c = ns.c + 1")
        elif r < 0.84:
            out += "{#" + control(rng) + " c " + control(rng) + "#}"
        elif r < 0.88:
            out += tag(rng, "raw") + text(rng) + "{{ r }}" + text(rng) + tag(rng, "endraw")
        elif r < 0.94:
            out += tag(rng, "macro m()") + statements(rng, depth + 1) + tag(rng, "endmacro")
        else:
            out += tag(rng, "set y") + statements(rng, depth + 1) + tag(rng, "endset")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--expressions", type=int, default=1000)
    parser.add_argument("--statements", type=int, default=500)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    env = reference.make_environment(1721995200)
    templates = [PRELUDE + "{{ " + expression(rng) + " }}" for _ in range(args.expressions)]
    templates += [
        "{% set ns = namespace(c=0) %}{% macro m() %}M{% endmacro %}" + text(rng) + statements(rng) + text(rng)
        for _ in range(args.statements)
    ]
    for source in templates:
        record = {"template": source}
        try:
            record["output"] = env.from_string(source).render()
        except Exception as error:  # every error is an expected outcome
            record["error"] = reference.error_kind(error)
        print(json.dumps(record, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
