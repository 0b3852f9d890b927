/* grammar.h: constrained decoding. A grammar in GBNF (the form llama.cpp
 * writes: `name ::= alternatives`, "literals", [classes], ( groups ), rule
 * references, postfix * + ? {m} {m,} {m,n}, `.`, # comments) is compiled once
 * per request into byte-level rules; a state (the set of parse stacks after
 * the text so far, as in a pushdown automaton) says which next bytes, and
 * so which vocabulary tokens, keep the text a prefix of a sentence of the
 * grammar. Token masks are computed by walking a trie of the vocabulary's
 * byte strings with the state, and cached per state (a JSON string's body,
 * say, is one state however long the string runs).
 *
 * Code points above U+007F in classes are compiled to the UTF-8 byte
 * sequences of their ranges, so the automaton sees bytes only. Left-recursive
 * rules are refused at compile time. */
#ifndef DP_SCHED_GRAMMAR_H
#define DP_SCHED_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

typedef struct dp_grammar dp_grammar;   /* compiled rules: immutable, reference-counted */
typedef struct dp_gstate dp_gstate;     /* one sequence's parse state (engine thread) */
typedef struct dp_gvocab dp_gvocab;     /* the vocabulary's byte trie (one per engine) */

/* Compiles GBNF text; the start rule is `root`. Returns 0, or DP_EINVAL with
 * a message naming the line and what is wrong (a syntax error, an undefined
 * rule, left recursion, a grammar that matches nothing, one too large: more
 * than 20000 rules or repetition counts above 4096), or DP_ENOMEM. *out has
 * one reference. */
int grammar_compile(dp_grammar **out, const char *gbnf, size_t len, char *err, size_t errsz);
void grammar_ref(dp_grammar *g);
void grammar_unref(dp_grammar *g);   /* frees at the last reference; NULL is fine */

/* Whether the whole of s (n bytes) is a sentence of the grammar. */
bool grammar_matches(const dp_grammar *g, const char *s, size_t n);

/* A state at the start of the text. NULL when out of memory. */
dp_gstate *gstate_new(dp_grammar *g);
void gstate_free(dp_gstate *s);
/* Consumes n bytes: 0, or DP_EINVAL when they do not continue a sentence,
 * or DP_ENOSPC when the parse would outgrow its limits (more than 1024
 * stacks or 4096 deep); the state is then unchanged. */
int gstate_advance(dp_gstate *s, const char *bytes, size_t n);
/* Whether n bytes (n > 0) continue the text: what gstate_advance would
 * accept, without changing the state; a token is allowed by
 * gstate_mask_logits exactly when its bytes are. */
bool gstate_allows(dp_gstate *s, const char *bytes, size_t n);
/* The text so far is a whole sentence (end of generation is allowed). */
bool gstate_accepting(const dp_gstate *s);
/* ... and nothing can follow it: generation ends here. */
bool gstate_done(const dp_gstate *s);

/* The vocabulary trie, built from the tokenizer (control tokens have no
 * bytes: only the end-of-generation ones are allowed, and only where the
 * state accepts). NULL when out of memory. */
dp_gvocab *gvocab_new(const dp_tokenizer *tok);
void gvocab_free(dp_gvocab *v);
/* Sets row[t] = -INFINITY for every token t that cannot come next (row has
 * the vocabulary's size). Returns the number of tokens left allowed (0 only
 * when the state is dead, which a sampled text never reaches). */
int32_t gstate_mask_logits(dp_gstate *s, const dp_gvocab *v, float *row);
/* Masks this state computed / took from its grammar's cache (shared by all
 * the grammar's states: the requests of one schema; engine thread only). */
void gstate_mask_stats(const dp_gstate *s, int64_t *computed, int64_t *cached);

#endif
