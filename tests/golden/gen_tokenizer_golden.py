#!/usr/bin/env python3
# gen_tokenizer_golden.py: writes tests/golden/tokenizer_smollm2.jsonl, the ids the
# reference (HF tokenizers, built from the GGUF's own vocab and merges) gives.
"""Golden token ids for tests/unit/test_tokenizer.c.

The reference is an HF `tokenizers.Tokenizer` built FROM THE GGUF (vocab,
merges, token types read with the `gguf` package), configured like SmolLM2's
tokenizer.json: BPE model, pre-tokenizer Sequence[Digits(individual_digits),
ByteLevel(add_prefix_space=False, use_regex=True)], ByteLevel decoder, and the
control tokens added as special tokens. Two more pre-tokenizers are covered
on the same vocabulary, as the C tokenizer selects them by tokenizer.ggml.pre:
  - "gpt2":   ByteLevel(use_regex=True) alone;
  - "llama3": Split(Llama-3 regex, isolated) + ByteLevel(use_regex=False), with
              BPE(ignore_merges=True) as Llama-3's tokenizer.json has it.

Invalid UTF-8. HF takes a str, so it cannot receive invalid bytes. The C
tokenizer's chosen behaviour: each byte that is not part of a valid UTF-8
sequence is a code point of its own in the "other" class (not a letter, digit
or space) and BPE sees it as its own byte (so decode(encode(x)) == x for any
bytes). (llama.cpp instead substitutes U+FFFD, losing the byte.) To get
expected ids for those inputs, this script has a second, pure-Python path:
the bytes are decoded with errors="surrogateescape" (each invalid byte becomes
a lone surrogate, category Cs, i.e. "other"), split on special tokens
(leftmost-longest), pre-tokenized with the same regexes (`regex` module), each
piece mapped back to bytes and through bytes_to_unicode, and then handed to the
HF BPE model directly (`tokenizer.model.tokenize`). That path is checked to
give HF's exact ids on every valid-UTF-8 string before it is trusted for the
invalid ones.

Bytes without a token. SmolLM2's vocabulary lacks the byte-level chars of 21
bytes (0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF). With no
unk token, HF's BPE drops them, and so does llama.cpp; the C tokenizer does
the same (the GGUF's unk id is <|endoftext|>, an end-of-generation token, so
emitting it would be worse). Such inputs do not round-trip.

Each line: {"pre": name, "special": 0|1, "b64": base64 of the input bytes,
"ids": [...], "detok_b64": base64 of what streaming detokenization must emit
(the decoded bytes with errors="replace": one U+FFFD per maximal invalid
subpart)}, plus "dec_b64" (what the ids decode to) when that differs from the
input, and "text" (the input, for people; absent for invalid UTF-8).

Usage: ~/.cache/dualpath/venv/bin/python tests/golden/gen_tokenizer_golden.py \
           [models/SmolLM2-135M-Instruct.Q4_1.gguf] > tests/golden/tokenizer_smollm2.jsonl
Needs: gguf, tokenizers, regex.
"""
import base64
import json
import random
import sys

import regex
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

WS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
S = "[" + WS + "]"
NS = "[^" + WS + "]"
GPT2_RE = ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + WS + "\\p{L}\\p{N}]+|"
           + S + "+(?!" + NS + ")|" + S + "+")
LLAMA3_RE_HF = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# Same, with \s spelled as White_Space for the `regex` module, and the
# case-insensitive group limited to ASCII letters as the C matcher does.
LLAMA3_RE_PY = ("'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL]|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^"
                + WS + "\\p{L}\\p{N}]+[\\r\\n]*|" + S + "*[\\r\\n]+|" + S + "+(?!" + NS + ")|" + S + "+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENC = bytes_to_unicode()
_BYTE_DEC_MAP = {c: b for b, c in BYTE_ENC.items()}


def BYTE_DEC(token):
    return bytes(_BYTE_DEC_MAP[c] for c in token)


def load_gguf(path):
    r = GGUFReader(path)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    toks = strs("tokenizer.ggml.tokens")
    merges = strs("tokenizer.ggml.merges")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    return toks, merges, types


def build_hf(toks, merges, types, pre, with_special):
    vocab = {t: i for i, t in enumerate(toks)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=(pre == "llama3")))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE_HF), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if with_special:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(toks, types) if ty in (3, 4)])
    return tok


def py_pretokenize(s, pre):
    """The regex pre-tokenization on a str that may hold lone surrogates."""
    if pre == "smollm":
        out = []
        for seg in regex.split("(\\p{N})", s):
            if seg:
                out += regex.findall(GPT2_RE, seg)
        return out
    if pre == "gpt2":
        return regex.findall(GPT2_RE, s)
    return regex.findall(LLAMA3_RE_PY, s)


def py_encode(tok, specials, data, pre, parse_special):
    """The pure-Python path: any bytes in, ids out (see the module doc)."""
    s = data.decode("utf-8", "surrogateescape")
    frags = []
    if parse_special and specials:
        pat = "|".join(regex.escape(x) for x in sorted(specials, key=len, reverse=True))
        pos = 0
        for m in regex.finditer(pat, s):
            frags.append((False, s[pos:m.start()]))
            frags.append((True, m.group(0)))
            pos = m.end()
        frags.append((False, s[pos:]))
    else:
        frags = [(False, s)]
    ids = []
    for is_special, frag in frags:
        if is_special:
            ids.append(tok.token_to_id(frag))
            continue
        for piece in py_pretokenize(frag, pre):
            b = piece.encode("utf-8", "surrogateescape")
            word = "".join(BYTE_ENC[x] for x in b)
            if pre == "llama3" and tok.token_to_id(word) is not None:
                ids.append(tok.token_to_id(word))
                continue
            ids += [t.id for t in tok.model.tokenize(word)]
    return ids


def corpus():
    """(bytes, parse_special) cases, deterministic."""
    c = []

    def add(x, special=False):
        c.append((x.encode("utf-8") if isinstance(x, str) else x, special))

    ascii_sentences = [
        "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "I can't believe it's not butter.", "What's up? I'm fine, you're great, we've done it, they'll go, he'd say.",
        "IT'S LOUD. DON'T SHOUT. WE'RE HERE. YOU'VE GOT IT. I'M OK. WE'LL SEE. HE'D KNOW.",
        "She said 'hello' and 'sup' and 'the end'", "rock 'n' roll", "'s 't 're 've 'm 'll 'd",
        "''s '''t", "Mr. Smith went to Washington.", "e.g. i.e. etc.", "A", "a", " ", "",
        "Once upon a time, in a land far, far away, there lived a dragon.",
        "To be, or not to be, that is the question:",
        "SmolLM2 is a family of compact language models.", "OpenAI-compatible API server",
        "Transformers are neural networks.", "CamelCaseWordsAndMoreWords", "snake_case_identifier",
        "kebab-case-identifier", "ALLCAPS", "MiXeD cAsE", "x", "xyzzy plugh",
        "supercalifragilisticexpialidocious", "antidisestablishmentarianism",
        "Pneumonoultramicroscopicsilicovolcanoconiosis",
    ]
    for s in ascii_sentences:
        add(s)
    spaces = [
        "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n", "\n ",
        " \n ", "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a \n b", "a\n \nb",
        "hello ", "hello  ", "hello   ", " hello", "  hello", "   hello", "\thello", "\nhello",
        "hello\n", "hello\n\n", "hello \n", "a\r\nb", "a\rb", "a\x0bb", "a\x0cb", " \t \n \r ",
        "end with tab\t", "word\t\tword", "  leading and trailing  ", "\u00a0nbsp\u00a0here",
        "ideographic\u3000space", "en\u2002quad", "line\u2028sep", "para\u2029sep", "nel\x85here",
        "ogham\u1680mark", "narrow\u202fnbsp", "zero\u200bwidth", "mongolian\u180evowel",
        "info\x1fsep\x1cfs", "bell\x07char", "eot\x04x\x06y\x1dz (bytes with no token)", "nul\x00byte", "del\x7fchar", "   \n\n   x",
        "x   \n\n   ", "tab\t \tmix", " ! ", "  !!", "\n\n!!", "a \u00a0b", "1 2  3   4",
    ]
    for s in spaces:
        add(s)
    digits = [
        "0", "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "2,718,281", "1e10", "-42",
        "+7", "0x1F", "1/2", "50%", "$100", "100$", "v1.2.3", "2024-01-31", "12:34:56", "ID 00042",
        "a1b2c3", "abc123def", " 123", "  123", "123 ", "1 000 000", "phone: +1 (555) 123-4567",
        "\u00b2\u00b3\u00bd", "\u2167 Roman", "\u0663\u0664\u0665 arabic-indic", "\u0967\u0968 devanagari",
        "\uff11\uff12\uff13 fullwidth", "7th 21st 3rd 2nd", "x^2 + y^2 = z^2", "99 bottles", "0.000001",
        "1234567890123456789012345678901234567890",
    ]
    for s in digits:
        add(s)
    punct = [
        "!", "!!", "!!!", "?!", "...", "\u2026", "--", "---", "\u2014 em dash \u2013 en dash",
        "(parens)", "[brackets]", "{braces}", "<angle>", "\"quotes\"", "\u201csmart quotes\u201d",
        "\u2018single\u2019", "a,b;c:d", "#hashtag @mention", "email@example.com",
        "https://example.com/path?q=1&r=2#frag", "C:\\Windows\\System32", "~/.bashrc", "a->b=>c",
        "x != y && y <= z || !w", "***bold*** __under__", "`code`", "| table | row |", "^_^ :) :-( ;-)",
        "\u00bfQu\u00e9? \u00a1S\u00ed!", "\u00ab\u00bb\u2039\u203a", "\u00a7 \u00b6 \u2020 \u2021",
        "\u00a9 \u00ae \u2122", "\u20ac 5 \u00a3 3 \u00a5 9", " .", " ..", " !x", " ! x",
    ]
    for s in punct:
        add(s)
    code = [
        "int main(void) { return 0; }",
        "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n    printf(\"hello\\n\");\n    return 0;\n}\n",
        "for (size_t i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}",
        "def foo(x, y=2):\n    \"\"\"Docstring.\"\"\"\n    return x ** y  # comment\n",
        "class A:\n    def __init__(self):\n        self.x = [1, 2, 3]\n\n\n",
        "if __name__ == '__main__':\n    main()\n",
        "{\"key\": \"value\", \"n\": 12, \"list\": [1, 2.5, true, null], \"nested\": {\"a\": {}}}",
        "[\n  {\n    \"id\": 1\n  }\n]", "SELECT * FROM users WHERE id = 42;",
        "<html><body><p class=\"x\">Hi</p></body></html>", "fn main() { println!(\"{}\", 1 + 2); }",
        "const f = (a, b) => a ?? b;", "x = y if z else w", "#!/bin/sh\nset -eu\necho \"$HOME\"\n",
        "    indented four", "        indented eight", "\t\tindented tabs", "a = b  # two spaces",
        "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n",
        "\\begin{equation} E = mc^2 \\end{equation}",
    ]
    for s in code:
        add(s)
    intl = [
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u559c\u6b22\u5b66\u4e60\u4eba\u5de5\u667a\u80fd\u3002",
        "\u4e2d\u6587 English \u6df7\u5408 text",
        "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57",
        "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a 1-2-3", "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
        "\u0394\u03b5\u03bd \u03be\u03ad\u03c1\u03c9", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "Xin ch\u00e0o th\u1ebf gi\u1edbi",
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade", "cafe\u0301 (combining)", "\u00c5ngstr\u00f6m",
        "Stra\u00dfe \u00fcber \u00f6l", "\u0141\u00f3d\u017a \u017c\u00f3\u0142w", "\u0130stanbul \u0131\u015f\u0131k",
        "\u00e9\u00e8\u00ea\u00eb\u00c9\u00c8\u00ca\u00cb", "\u1e9e\u00df", "\u01c5\u01c8 titlecase",
        "\u0f00\u0f01 tibetan", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
        "\u12a0\u121b\u122d\u129b", "\U00010348 gothic", "\U0001d400\U0001d401 math bold",
        "\U00020000 cjk ext b", "\uff21\uff22\uff23 fullwidth latin", "\uff8a\uff9d\uff76\uff78 halfwidth",
    ]
    for s in intl:
        add(s)
    emoji = [
        "\U0001f600", "\U0001f600\U0001f601\U0001f602", "I \u2764\ufe0f you", "\U0001f44d\U0001f3fd",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
        "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5 \U0001f1eb\U0001f1f7",
        "\U0001f9d1\u200d\U0001f4bb coding", "smile \U0001f642 ok", "\u2600\u2601\u2602\u2603",
        "\U0001f525\U0001f525\U0001f525", "a\U0001f600b", "1\U0001f6002", "\u263a", "#\ufe0f\u20e3 keycap",
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f scotland",
    ]
    for s in emoji:
        add(s)
    special = [
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>", "<|endoftext|><|endoftext|>", "a<|im_end|>b", " <|im_start|> ",
        "<|im_start|", "<|im_start|><|im_start|>x", "<|im_end|>\n", "<file_sep>main.c<filename>",
        "<repo_name>x<reponame>y<gh_stars>", "<<|im_end|>>", "<|im_start|>\u00e9\U0001f600<|im_end|>",
        "text <jupyter_code>print(1)<jupyter_output>1<empty_output>",
    ]
    for s in special:
        add(s, True)
        add(s, False)
    invalid = [
        b"\xff", b"\xfe\xff", b"abc\xffdef", b"\x80", b"\x80\x80\x80", b"hello \x80world",
        b"\xc3", b"\xc3(", b"caf\xc3", b"caf\xc3\xa9\xc3", b"\xe2\x82", b"\xe2\x82(", b"\xe2\x82\xac",
        b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80\xf0\x9f", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe0\x80\xaf",
        b"\xf4\x90\x80\x80", b"\xf5\x80", b"a \xff b", b" \xff", b"\xff ", b"1\xff2", b"x\xc3\xa9\xff\xfey",
        b"\xc2\xa0\xff", b"\xff\xfe\xfd\xfc", b"<|im_start|>\xff<|im_end|>", b"'\xffs", b"\n\xff\n",
        b"\xe4\xbd\xa0\xe5\xa5", bytes(range(256)), bytes(range(128, 256)),
    ]
    for s in invalid:
        add(s, b"<|" in s)
    # Long inputs.
    lorem = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
             "incididunt ut labore et dolore magna aliqua. ")
    add(lorem * 40)
    add("a" * 3000)
    add(" " * 2000)
    add(" " * 500 + "x")
    add("\n" * 300 + "end")
    add("9" * 1000)
    add("\u4e2d" * 700)
    add("ab " * 1000)
    add(("The price is $1,234.56 (incl. 20% VAT); see https://shop.example/item?id=42 \u2014 "
         "caf\u00e9 \U0001f600 \u4f60\u597d.\n") * 20)
    # Seeded random mixes of the pieces that stress the pre-tokenizer.
    atoms = ["a", "Z", "word", " ", "  ", "\t", "\n", "\r\n", "1", "23", "456", "'s", "'T", "'re", "'",
             ".", "!?", "(", ")", "\u00e9", "\u4e2d", "\U0001f600", "\u200d", "\u0301", "\u00a0", "\u3000",
             "_", "-", "$", "<|im_end|>", "\u0663", "\u00bd", "x'll", "I'M", "\x1c", "#"]
    rng = random.Random(1234)
    for _ in range(140):
        s = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 24)))
        add(s, rng.random() < 0.5)
    for _ in range(20):
        b = bytes(rng.choice([rng.randint(0, 255), ord("a"), 0x20, 0xC3, 0xA9, 0xE4, 0xB8])
                  for _ in range(rng.randint(1, 20)))
        add(b)
    return c


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    toks, merges, types = load_gguf(path)
    specials = [t for t, ty in zip(toks, types) if ty in (3, 4)]
    cases = corpus()
    out = sys.stdout
    counts = {}
    for pre in ("smollm", "gpt2", "llama3"):
        hf = {True: build_hf(toks, merges, types, pre, True), False: build_hf(toks, merges, types, pre, False)}
        for data, special in cases:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if pre != "smollm" and (text is None or special):
                continue  # the other pre-tokenizers: valid text, no special parsing
            py_ids = py_encode(hf[special], specials, data, pre, special)
            if text is not None:
                ids = hf[special].encode(text, add_special_tokens=False).ids
                if ids != py_ids:
                    sys.exit("python path disagrees with HF on %r (%s): %s vs %s" % (text, pre, ids, py_ids))
            else:
                ids = py_ids
            # What the ids decode to: the input, less any byte the vocabulary
            # has no token for (HF and llama.cpp drop those).
            dec = b"".join(BYTE_DEC(toks[i]) if types[i] == 1 else toks[i].encode() for i in ids)
            rec = {"pre": pre, "special": int(special), "b64": base64.b64encode(data).decode(),
                   "ids": ids,
                   "detok_b64": base64.b64encode(dec.decode("utf-8", "replace").encode("utf-8")).decode()}
            if dec != data:
                rec["dec_b64"] = base64.b64encode(dec).decode()
            if text is not None:
                rec["text"] = text
            out.write(json.dumps(rec, ensure_ascii=True) + "\n")
            counts[pre] = counts.get(pre, 0) + 1
    sys.stderr.write("golden lines: %s\n" % counts)


if __name__ == "__main__":
    main()
