/* test_grammar.c: the GBNF compiler and its automaton. Sentences and
 * non-sentences of small grammars and of a JSON grammar; repetition bounds;
 * classes beyond ASCII (compiled to UTF-8 byte sequences); errors that name
 * the line (syntax, an undefined rule, left recursion); and token masks on
 * a real vocabulary (the default model's when present, else the synthetic
 * one): every token a mask allows continues the state, every token it
 * refuses does not, and random walks through the masks produce sentences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "sched/grammar.h"
#include "t.h"
#include "tools/synth_gguf.h"

static dp_grammar *compile(const char *src)
{
    dp_grammar *g = NULL;
    char err[DP_ERRLEN] = "";
    int rc = grammar_compile(&g, src, strlen(src), err, sizeof err);
    CHECK_MSG(rc == 0, "compile failed: %s\n%s", err, src);
    return g;
}

static void expect_error(const char *src, const char *needle)
{
    dp_grammar *g = NULL;
    char err[DP_ERRLEN] = "";
    CHECK_MSG(grammar_compile(&g, src, strlen(src), err, sizeof err) == DP_EINVAL,
              "compiled: %s", src);
    CHECK_MSG(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    CHECK(g == NULL);
}

static void yes(const dp_grammar *g, const char *s)
{
    CHECK_MSG(grammar_matches(g, s, strlen(s)), "should match: '%s'", s);
}

static void no(const dp_grammar *g, const char *s)
{
    CHECK_MSG(!grammar_matches(g, s, strlen(s)), "should not match: '%s'", s);
}

static const char *JSON =
    "# JSON, as llama.cpp's grammars/json.gbnf writes it\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_basics(void)
{
    dp_grammar *g = compile("root ::= \"a\" | \"bc\"");
    yes(g, "a");
    yes(g, "bc");
    no(g, "");
    no(g, "b");
    no(g, "abc");
    grammar_unref(g);

    g = compile("root ::= x{2,3} y?  # bounded\nx ::= [a-c]\ny ::= \"!\"");
    yes(g, "ab");
    yes(g, "abc!");
    yes(g, "cc!");
    no(g, "a");
    no(g, "abca");
    grammar_unref(g);

    g = compile("root ::= \"<\" [^>]* \">\" | (\"x\" \"y\")+");
    yes(g, "<>");
    yes(g, "<a b\xc3\xa9>");
    yes(g, "xyxy");
    no(g, "xyx");
    no(g, "<a>b");
    grammar_unref(g);

    /* Beyond ASCII: ranges of code points as UTF-8. */
    g = compile("root ::= [\xce\xb1-\xcf\x89]+ [\\u4e00-\\u9fff]? .");
    yes(g, "\xce\xb1\xce\xb2\xcf\x89z");          /* alpha beta omega z */
    yes(g, "\xce\xb1\xe4\xb8\xad\xf0\x9f\x98\x80"); /* alpha, a CJK char, an emoji */
    no(g, "a\xce\xb1z");
    no(g, "\xce\xb1\xce");                          /* a character cut short */
    grammar_unref(g);

    g = compile(JSON);
    yes(g, "{}");
    yes(g, "{\"a\": [1, 2.5, -3e5, true, null, \"x\\u00e9\\n\"], \"b\": {\"c\": {}}}");
    yes(g, "{\n  \"k\": \"v\"\n}");
    no(g, "{\"a\": }");
    no(g, "{\"a\" 1}");
    no(g, "[1]");
    no(g, "{\"a\": 01}");
    no(g, "{\"a\": \"\x01\"}");
    grammar_unref(g);
}

static void test_errors(void)
{
    expect_error("root ::= x", "undefined rule: x");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error("root ::= root \"a\" | \"b\"", "left recursion");
    expect_error("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left recursion");
    expect_error("root ::= \"a", "line 1: unterminated string");
    expect_error("x ::= \"a\"", "no rule named root");
    expect_error("root ::= (\"a\"", "missing )");
    expect_error("root ::= \"a\"{3,2}", "repetition");
    expect_error("root ::= \"a\"\n\nfoo ::= [\n", "line 3");
    expect_error("root ::= \"\\q\"", "unknown escape");
}

/* What a request's grammar may cost is bounded: repetition counts, the size
 * lowering makes, expansions of ambiguous nullable rules (memoised, so 2^30
 * ways to match nothing cost 30 steps), and the parse's depth. */
static void test_limits(void)
{
    expect_error("root ::= (\"a\"?){0,100000}", "repetition");
    expect_error("root ::= \"a\"{0,4000} \"b\"{0,4000} \"c\"{0,4000} \"d\"{0,4000} "
                 "\"e\"{0,4000} \"f\"{0,4000}", "too large");
    expect_error("root ::= [\\uD800-\\uDFFF]", "matches nothing");
    /* An "a" that may be any of 4000 optional repeats: 4000 parses at once. */
    expect_error("root ::= (\"a\"?){0,4000} \"z\"", "too ambiguous");
    dp_grammar *g = compile("root ::= (\"ab\"){0,4000} \"z\"");
    yes(g, "ababz");
    yes(g, "z");
    no(g, "abaz");
    grammar_unref(g);
    char src[512] = "root ::=";
    for (int i = 0; i < 30; i++)
        strcat(src, " w");
    strcat(src, " \"z\"\nw ::= \"a\"? | \"b\"?");
    g = compile(src);
    yes(g, "z");
    yes(g, "abbaz");
    no(g, "abc");
    grammar_unref(g);
    /* Nesting past the parse's depth: refused there, never dropped. */
    g = compile("root ::= \"(\" root \")\" | \"x\"");
    dp_gstate *s = gstate_new(g);
    int rc = 0, depth = 0;
    while (rc == 0 && depth < 10000) {
        rc = gstate_advance(s, "(", 1);
        depth += rc == 0;
    }
    CHECK_EQ_INT(rc, DP_ENOSPC);
    CHECK(depth > 1000);
    CHECK(gstate_advance(s, "x", 1) == 0 && !gstate_accepting(s));
    gstate_free(s);
    grammar_unref(g);
    printf("grammar limits: repetition, size, matching nothing refused; 2^30-way nullable "
           "expansion memoised; nesting refused past depth %d\n", depth);
}

static dp_tokenizer *open_tokenizer(dp_gguf *g, void **buf)
{
    char err[DP_ERRLEN];
    const char *real = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    *buf = NULL;
    if (access(real, R_OK) == 0 && !getenv("DP_TEST_SYNTHETIC_ONLY")) {
        CHECK_MSG(gguf_open(g, real, err, sizeof err) == 0, "%s", err);
    } else {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny", &sh) == 0);
        gguf_writer gw;
        size_t size;
        CHECK(gguf_writer_init(&gw) == 0);
        CHECK(synth_llama_build(&gw, &sh, 3, DP_TYPE_Q8_0, err, sizeof err) == 0);
        CHECK(gguf_writer_finish_mem(&gw, buf, &size) == 0);
        gguf_writer_destroy(&gw);
        CHECK_MSG(gguf_open_mem(g, *buf, size, err, sizeof err) == 0, "%s", err);
    }
    dp_tokenizer *tok;
    CHECK_MSG(tokenizer_init_gguf(&tok, g, err, sizeof err) == 0, "%s", err);
    return tok;
}

static uint64_t rs = 7;
static uint32_t urand(uint32_t n)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)((rs >> 33) % n);
}

/* Random walks: at each step the mask must agree with advancing token by
 * token, and the text built must be a sentence when the walk ends. */
static void walk_grammar(const dp_tokenizer *tok, const dp_gvocab *v, const char *src, int walks,
                         const char *what)
{
    dp_grammar *g = compile(src);
    const int32_t nv = tokenizer_n_vocab(tok);
    float *row = malloc((size_t)nv * sizeof *row);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    char text[4096], piece[512];
    int64_t computed = 0, cached = 0, checked = 0;
    int sentences = 0;
    for (int w = 0; w < walks; w++) {
        dp_gstate *s = gstate_new(g);
        CHECK(s != NULL);
        size_t len = 0;
        for (int step = 0; step < 60; step++) {
            for (int32_t t = 0; t < nv; t++)
                row[t] = 0.0f;
            int32_t n = gstate_mask_logits(s, v, row);
            CHECK(n > 0);
            int32_t na = 0;
            for (int32_t t = 0; t < nv; t++)
                if (row[t] == 0.0f)
                    allowed[na++] = t;
            CHECK_EQ_INT(na, n);
            /* Allowed tokens continue the text, others do not (a sample of
             * each, to keep the test quick on a real vocabulary). */
            for (int k = 0; k < 64; k++) {
                int32_t t = (int32_t)urand((uint32_t)nv);
                int pn = tokenizer_token_bytes(tok, t, false, piece, sizeof piece);
                if (pn <= 0 || pn > (int)sizeof piece)
                    continue;
                dp_gstate *c = gstate_new(g);
                CHECK(gstate_advance(c, text, len) == 0);
                /* gstate_allows (the engine's check of a token sampled
                 * from the unmasked row) agrees with the mask too. */
                CHECK_MSG(gstate_allows(s, piece, (size_t)pn) == (row[t] == 0.0f),
                          "%s: token %d: gstate_allows disagrees with the mask", what, t);
                bool ok = gstate_advance(c, piece, (size_t)pn) == 0;
                CHECK_MSG(ok == (row[t] == 0.0f), "%s: token %d '%.*s' after '%.*s': mask %d, "
                          "advance %d", what, t, pn, piece, (int)len, text, row[t] == 0.0f, ok);
                gstate_free(c);
                checked++;
            }
            int32_t t = allowed[urand((uint32_t)na)];
            if (tokenizer_is_eog(tok, t)) {
                CHECK(gstate_accepting(s));
                break;
            }
            int pn = tokenizer_token_bytes(tok, t, false, piece, sizeof piece);
            CHECK(pn > 0);
            CHECK(gstate_advance(s, piece, (size_t)pn) == 0);
            CHECK(len + (size_t)pn < sizeof text);
            memcpy(text + len, piece, (size_t)pn);
            len += (size_t)pn;
            if (gstate_done(s))
                break;
        }
        if (gstate_accepting(s)) {
            CHECK_MSG(grammar_matches(g, text, len), "%s: walk ended in '%.*s'", what, (int)len, text);
            sentences++;
        }
        int64_t a, b;
        gstate_mask_stats(s, &a, &b);
        computed += a;
        cached += b;
        gstate_free(s);
    }
    printf("grammar masks (%s): %d walks, %d ended in sentences, %lld tokens checked against "
           "the automaton; %lld masks computed, %lld from the cache\n", what, walks, sentences,
           (long long)checked, (long long)computed, (long long)cached);
    free(row);
    free(allowed);
    grammar_unref(g);
}

static void test_masks(void)
{
    dp_gguf gg;
    void *buf;
    dp_tokenizer *tok = open_tokenizer(&gg, &buf);
    dp_gvocab *v = gvocab_new(tok);
    CHECK(v != NULL);
    walk_grammar(tok, v, JSON, 6, "json");
    walk_grammar(tok, v, "root ::= (\"yes\" | \"no\" | \"maybe so\") \".\"", 10, "choice");
    walk_grammar(tok, v, "root ::= [0-9]{3} \"-\" [a-z]+ \"\\n\"", 10, "pattern");
    gvocab_free(v);
    tokenizer_destroy(tok);
    gguf_close(&gg);
    free(buf);
}

int main(void)
{
    test_basics();
    test_errors();
    test_limits();
    test_masks();
    T_DONE("grammar");
}
