#!/usr/bin/env python3
"""Renders the chat-template conformance suite with Python's jinja2, the reference.

Every template of tests/data/chat_templates/manifest.json is rendered with every
conversation of tests/data/chat_templates/conversations/ in the environment Hugging Face's
apply_chat_template uses (transformers' chat-template utilities): jinja2's
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
extension, a {% generation %} block, tojson = json.dumps(x, ensure_ascii=False, indent,
separators, sort_keys), raise_exception(message) and strftime_now(format), the clock fixed
at the manifest's now_unix.

  --write   (re)write tests/data/chat_templates/expected/<template>/<conversation>.txt
            (the rendered bytes) or .error (a template error: JSON kind, type, message)
  --check   render again and compare with the committed files; exit 1 on any difference

Exit status 77 when jinja2 is not installed (python3-jinja2 on Debian); the tests read it
as "skipped".
"""

import argparse
import datetime
import json
import os
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed: cannot render the reference", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "data", "chat_templates")


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant text with it;
    outside training it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def make_environment(now_unix):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(now_unix).strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def error_kind(error):
    """The step35 jinja::ErrorKind an exception corresponds to."""
    if isinstance(error, (jinja2.exceptions.TemplateSyntaxError, jinja2.exceptions.TemplateAssertionError, SyntaxError)):
        return "syntax"  # SyntaxError: jinja2 compiles {% break %} outside a loop to invalid Python
    if isinstance(error, jinja2.exceptions.UndefinedError):
        return "undefined"
    if isinstance(error, jinja2.exceptions.SecurityError):
        return "security"
    if type(error) is jinja2.exceptions.TemplateError:
        return "raised"
    if isinstance(error, (OverflowError, RecursionError)):
        return "limit"  # range() above the sandbox's cap; runaway recursion
    return "type"


def render_variables(template, conversation):
    """What apply_chat_template passes: messages, tools, documents, add_generation_prompt,
    the tokenizer's special tokens, then the caller's extra keyword arguments."""
    variables = {
        "messages": conversation["messages"],
        "tools": conversation.get("tools"),
        "documents": None,
        "add_generation_prompt": conversation.get("add_generation_prompt", False),
    }
    variables.update(template.get("variables", {}))
    variables.update(conversation.get("extra", {}))
    return variables


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def render_all(data):
    """{(template, conversation): ("output", text) or ("error", json text)}."""
    manifest = load_json(os.path.join(data, "manifest.json"))
    env = make_environment(manifest["now_unix"])
    conversations = {}
    for name in sorted(os.listdir(os.path.join(data, "conversations"))):
        if name.endswith(".json"):
            conversations[name[: -len(".json")]] = load_json(os.path.join(data, "conversations", name))
    results = {}
    for template in manifest["templates"]:
        with open(os.path.join(data, template["file"]), encoding="utf-8", newline="") as f:
            compiled = env.from_string(f.read())
        for conv_name, conversation in conversations.items():
            try:
                text = compiled.render(**render_variables(template, conversation))
                results[(template["name"], conv_name)] = ("output", text)
            except Exception as error:  # every template error is an expected outcome
                record = {"kind": error_kind(error), "type": type(error).__name__, "message": str(error)}
                results[(template["name"], conv_name)] = ("error", json.dumps(record, ensure_ascii=False) + "\n")
    return results


def expected_path(data, template, conversation, what):
    suffix = ".txt" if what == "output" else ".error"
    return os.path.join(data, "expected", template, conversation + suffix)


def write(data, results):
    expected_root = os.path.join(data, "expected")
    wanted = set()
    for (template, conversation), (what, text) in results.items():
        path = expected_path(data, template, conversation, what)
        wanted.add(os.path.normpath(path))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    # Drop expectations of templates or conversations that are gone.
    for root, _, files in os.walk(expected_root):
        for name in files:
            path = os.path.normpath(os.path.join(root, name))
            if path not in wanted:
                os.remove(path)
    outputs = sum(1 for what, _ in results.values() if what == "output")
    print(f"wrote {len(results)} expectations ({outputs} renderings, {len(results) - outputs} template errors)")


def check(data, results):
    differences = 0
    for (template, conversation), (what, text) in sorted(results.items()):
        path = expected_path(data, template, conversation, what)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                committed = f.read()
        except FileNotFoundError:
            committed = None
        if committed != text:
            differences += 1
            print(f"jinja2 renders {template} x {conversation} differently from {path}", file=sys.stderr)
    if differences:
        print(f"{differences} expectation(s) drifted: run {sys.argv[0]} --write and review", file=sys.stderr)
        return 1
    print(f"all {len(results)} expectations match jinja2 {jinja2.__version__}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the expected files")
    mode.add_argument("--check", action="store_true", help="compare jinja2's renderings with the expected files")
    parser.add_argument("--data", default=DEFAULT_DATA, help="the suite's folder (default: %(default)s)")
    args = parser.parse_args()
    results = render_all(args.data)
    if args.write:
        write(args.data, results)
        return 0
    return check(args.data, results)


if __name__ == "__main__":
    sys.exit(main())
