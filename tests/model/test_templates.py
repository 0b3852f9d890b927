#!/usr/bin/env python3
# test_templates.py: the golden test of the chat template engine: real model
# templates rendered by jinja2 (as transformers does) and by dp-template must agree.
"""Golden test of model/jinja.c against jinja2 on real chat templates.

The templates are read at run time from llama.cpp's models/templates, which
the llama-cpp-python sdist vendors (downloaded as tools/llama-cpp.sh does,
into ${DP_CACHE:-~/.cache/dualpath}/llama-cpp-src), plus SmolLM2's own from
models/SmolLM2-135M-Instruct.Q4_1.gguf. For each template, every
conversation is rendered by jinja2 with Hugging Face's settings and by
dp-template; the texts must be byte-identical, and a conversation the
template rejects (raise_exception) must be rejected by both.

Usage: ~/.cache/dualpath/venv/bin/python tests/model/test_templates.py --bin build/tools/dp-template
Needs: jinja2, gguf (the project's venv).
"""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tarfile
import re
import tempfile
import time

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("DP_CACHE", os.path.expanduser("~/.cache/dualpath"))
SRC = os.path.join(CACHE, "llama-cpp-src")
NOW = 1722000000  # 26 Jul 2024, 13:20 UTC: strftime_now's fixed time

REQUIRED = [
    "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407", "google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "HuggingFaceTB-SmolLM3-3B",
]
THINKING = {"Qwen-Qwen3-0.6B", "HuggingFaceTB-SmolLM3-3B"}

# (name, messages, add_generation_prompt, kwargs)
CONVS = [
    ("single user", [{"role": "user", "content": "Hello!"}], True, None),
    ("system+user", [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "What is 2+2?"}], True, None),
    ("multi-turn", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello. How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], True, None),
    ("padded", [{"role": "user", "content": "  spaced out \n"},
                {"role": "assistant", "content": " answer \t"},
                {"role": "user", "content": "\n\nagain  "}], True, None),
    ("unicode", [{"role": "user", "content": "h\u00e9llo \u4e16\u754c \U0001F680 \u3000\"quotes\" 'x' \\ <tag>"}],
     True, None),
    ("no generation prompt", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
     False, None),
    ("assistant last", [{"role": "user", "content": "Count to 3"}, {"role": "assistant", "content": "1, 2,"},
                        {"role": "user", "content": "go on"}, {"role": "assistant", "content": "3"}],
     False, None),
]
THINK_CONV = ("enable_thinking=false", CONVS[2][1], True, {"enable_thinking": False})
# A tool round trip (for the templates that take tools): the tool list, an
# assistant call with its arguments as an object, the tool's result (its id
# nine letters and digits, as Mistral's templates demand), then a prompt.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_CONV = ("tool round trip", [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call0A1b2", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call0A1b2", "name": "get_weather", "content": "18 C, sunny"},
], True, {"tools": TOOLS})

# bos, eos and whether the tokenizer adds BOS (then dp-template, as the daemon,
# leaves a leading BOS out of the text), per family.
SPECIAL = {
    "Qwen": ("", "<|im_end|>", False), "meta-llama": ("<|begin_of_text|>", "<|eot_id|>", True),
    "deepseek": ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", True),
    "google": ("<bos>", "<eos>", True), "microsoft": ("<s>", "<|endoftext|>", True),
    "dualpath-gemma": ("<bos>", "<eos>", True),
    "HuggingFaceTB": ("", "<|im_end|>", False),
    # SmolLM2's BOS is <|im_start|>, which its renderings start with; it adds none
    "SmolLM2": ("<|im_start|>", "<|im_end|>", False),
}


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}: transformers' AssistantTracker; renders its body as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers replaces jinja2's tojson (no HTML escaping)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, tz=datetime.timezone.utc).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def templates_dir():
    tars = sorted(glob.glob(os.path.join(SRC, "llama_cpp_python-*.tar.gz")), key=os.path.getmtime)
    if not tars:
        print("test_templates: downloading the llama-cpp-python sdist", file=sys.stderr)
        os.makedirs(SRC, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", ":all:", "-d", SRC, "llama-cpp-python"])
        tars = sorted(glob.glob(os.path.join(SRC, "llama_cpp_python-*.tar.gz")), key=os.path.getmtime)
        if r.returncode or not tars:
            sys.exit("test_templates: cannot download the llama-cpp-python sdist (its templates are "
                     "the test's input); put it in %s" % SRC)
    tar = tars[-1]
    name = os.path.basename(tar)[:-len(".tar.gz")]
    tdir = os.path.join(SRC, name, "vendor", "llama.cpp", "models", "templates")
    if not os.path.isdir(tdir):
        prefix = name + "/vendor/llama.cpp/models/templates/"
        with tarfile.open(tar) as t:
            members = [m for m in t.getmembers() if m.name.startswith(prefix) and m.isfile()]
            t.extractall(SRC, members=members)
    if not os.path.isdir(tdir):
        sys.exit("test_templates: %s has no models/templates" % tar)
    return tdir


def smollm2_template(tmp):
    from gguf import GGUFReader
    path = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        return None
    f = GGUFReader(path).fields["tokenizer.chat_template"]
    src = bytes(f.parts[f.data[0]]).decode("utf-8")
    out = os.path.join(tmp, "SmolLM2-135M-Instruct.jinja")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(src)
    return out


def builtin_templates(tmp):
    """The templates model/chat_template.c carries for files without one
    (Gemma's), taken from its C string literals: what the daemon renders."""
    src = open(os.path.join(ROOT, "model", "chat_template.c"), encoding="utf-8").read()
    out = {}
    for cname, name in (("gemma_src", "dualpath-gemma-builtin"),):
        body = src[src.index("static const char %s[] =" % cname):]
        body = body[body.index("=") + 1:body.index(";\n")]
        lits = re.findall(r'"((?:[^"\\]|\\.)*)"', body)
        text = "".join(bytes(x, "utf-8").decode("unicode_escape") for x in lits)
        path = os.path.join(tmp, name + ".jinja")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        out[name] = path
    return out


def special(name):
    for k, v in SPECIAL.items():
        if name.startswith(k):
            return v
    return ("<s>", "</s>", True)


def run_one(binpath, env, tpath, src, name, conv):
    title, msgs, agp, kwargs = conv
    bos, eos, add_bos = special(name)
    try:
        want = env.from_string(src).render(messages=msgs, add_generation_prompt=agp, bos_token=bos,
                                           eos_token=eos, **(kwargs or {}))
        if add_bos and bos and want.startswith(bos):
            want = want[len(bos):]  # the tokenizer adds BOS: dp-template leaves it out
        want_err = None
    except (jinja2.exceptions.TemplateError, TypeError) as e:
        # (TypeError: a template that serializes a generator, as some tool
        # templates' "tools | map(...) | tojson" does here, fails in jinja2.)
        want, want_err = None, str(e)
    cmd = [binpath, tpath, json.dumps(msgs), "--bos", bos, "--eos", eos, "--now", str(NOW)]
    if not add_bos:
        cmd.append("--keep-bos")
    if not agp:
        cmd.append("--no-generation-prompt")
    kw = dict(kwargs or {})
    if "tools" in kw:
        cmd += ["--tools", json.dumps(kw.pop("tools"))]
    if kw:
        cmd += ["--kwargs", json.dumps(kw)]
    r = subprocess.run(cmd, capture_output=True, env=dict(os.environ, TZ="UTC"))
    if want_err is not None:
        if r.returncode == 1:
            return True, "both reject: %s" % want_err
        return False, "jinja2 rejects (%s), dp-template rendered %r" % (want_err, r.stdout[:200])
    if r.returncode != 0:
        return False, "dp-template failed: %s" % r.stderr.decode(errors="replace").strip()
    got = r.stdout.decode("utf-8", errors="surrogateescape")
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        return False, "differs at %d:\n  want %r\n  got  %r" % (i, want[max(0, i - 40):i + 80],
                                                                 got[max(0, i - 40):i + 80])
    return True, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tools", "dp-template"))
    ap.add_argument("--all", action="store_true", help="also fail on the optional templates")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit("test_templates: %s is not an executable (build dp-template first)" % a.bin)
    t0 = time.time()
    tdir = templates_dir()
    env = make_env()
    tmpdir = tempfile.TemporaryDirectory(prefix="dp-templates-")
    tmp = tmpdir.name
    paths = {os.path.basename(p)[:-len(".jinja")]: p for p in glob.glob(os.path.join(tdir, "*.jinja"))}
    missing = [n for n in REQUIRED if n not in paths]
    if missing:
        sys.exit("test_templates: %s lacks %s" % (tdir, ", ".join(missing)))
    order = [n for n in REQUIRED]
    for name, path in builtin_templates(tmp).items():
        paths[name] = path
        order.append(name)
    s2 = smollm2_template(tmp)
    if s2:
        paths["SmolLM2-135M-Instruct"] = s2
        order.append("SmolLM2-135M-Instruct")
    required = set(order)
    order += sorted(n for n in paths if n not in required)
    rows, failed_required = [], []
    for name in order:
        src = open(paths[name], encoding="utf-8").read()
        try:
            env.from_string(src)
        except jinja2.exceptions.TemplateSyntaxError as e:
            rows.append((name, 0, 0, "jinja2 cannot parse: %s" % e, name in required))
            continue
        parse = subprocess.run([a.bin, paths[name], "[]", "--now", str(NOW)], capture_output=True)
        perr = parse.stderr.decode(errors="replace").strip()
        if parse.returncode and "jinja: " in perr and "line" in perr and (
                "unknown" in perr or "unsupported" in perr or "expected" in perr or "unexpected" in perr):
            rows.append((name, 0, 0, perr.replace("dp-template: ", ""), name in required))
            if name in required:
                failed_required.append(name)
            continue
        convs = CONVS + ([THINK_CONV] if name in THINKING else []) + \
            ([TOOL_CONV] if "tools" in src else [])
        ok, notes = 0, []
        for conv in convs:
            good, note = run_one(a.bin, env, paths[name], src, name, conv)
            ok += good
            if not good or a.verbose:
                notes.append("%s: %s" % (conv[0], note))
        rows.append((name, len(convs), ok, "; ".join(notes), name in required))
        if ok != len(convs) and name in required:
            failed_required.append(name)
    w = max(len(r[0]) for r in rows)
    print("%-*s  %-8s  %-13s  %s" % (w, "template", "required", "conversations", "identical"))
    for name, n, ok, note, req in rows:
        print("%-*s  %-8s  %-13d  %d%s" % (w, name, "yes" if req else "no", n, ok,
                                          "" if ok == n and n and not (a.verbose and note) else "   " + note))
    req_rows = [r for r in rows if r[4]]
    opt_rows = [r for r in rows if not r[4]]
    print("required: %d of %d templates identical on all of their conversations" %
          (sum(1 for r in req_rows if r[1] and r[1] == r[2]), len(req_rows)))
    print("optional: %d of %d templates identical on all of their conversations" %
          (sum(1 for r in opt_rows if r[1] and r[1] == r[2]), len(opt_rows)))
    print("(%.1f s)" % (time.time() - t0))
    bad = failed_required + ([r[0] for r in opt_rows if r[1] != r[2]] if a.all else [])
    if bad:
        print("FAIL: %s" % ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
