/* test_path.c: the path detector: valid and invalid transitions, the
 * repetition and kept-set-change signals, each decision rule, and the cost of
 * a decision (printed; the bound is checked loosely, timings are noisy). */
#include <stdio.h>
#include <stdlib.h>

#include "sched/path.h"
#include "t.h"

int main(void)
{
    dp_path_detector p;
    path_init(&p);
    CHECK(p.state == DP_PS_WAITING);
    CHECK(!path_set(&p, DP_PS_DECODE)); /* must prefill first */
    CHECK(path_set(&p, DP_PS_PREFILL));
    CHECK(path_set(&p, DP_PS_DECODE));
    CHECK(path_set(&p, DP_PS_PREFILL)); /* a new turn rebuilds */
    CHECK(path_set(&p, DP_PS_PREEMPTED));
    CHECK(!path_set(&p, DP_PS_PREFILL)); /* waits for admission first */
    CHECK(path_set(&p, DP_PS_DECODE));   /* a compact cache swapped back in */
    CHECK(path_set(&p, DP_PS_PREEMPTED));
    CHECK(path_set(&p, DP_PS_WAITING));  /* recomputed */
    CHECK(path_set(&p, DP_PS_PREFILL));
    CHECK(!path_set(&p, DP_PS_WAITING)); /* only a preempted one waits again */
    CHECK(path_state_name(DP_PS_DECODE)[0] == 'd');

    /* Repetition: distinct tokens 0; a period-8 loop close to 1. */
    int32_t t[1000];
    for (int i = 0; i < 1000; i++)
        t[i] = i;
    CHECK_NEAR(path_repetition(t, 1000, 4), 0.0, 1e-9);
    for (int i = 0; i < 1000; i++)
        t[i] = i % 8;
    CHECK(path_repetition(t, 1000, 4) > 0.98f);
    for (int i = 0; i < 1000; i++)
        t[i] = i < 500 ? i : i - 500; /* the second half repeats the first */
    CHECK_NEAR(path_repetition(t, 1000, 4), 497.0 / 997.0, 1e-6);
    CHECK_NEAR(path_repetition(t, 3, 4), 0.0, 0);

    /* Kept-set change. */
    int32_t a[2][4] = {{0, 1, 5, 9}, {0, 2, 3, 4}}, b[2][4] = {{0, 1, 5, 9}, {0, 2, 7, 8}};
    CHECK_NEAR(path_kept_change(&a[0][0], 4, &b[0][0], 4, 2), (0.0 + 0.5) / 2, 1e-6);
    CHECK_NEAR(path_kept_change(&a[0][0], 4, &a[0][0], 4, 2), 0.0, 1e-9);

    /* Decisions. */
    dp_path_opts o;
    path_opts_default(&o);
    path_init(&p);
    CHECK_EQ_INT(path_decide(&p, &o, 100, 200), DP_STAY); /* not prefilling yet */
    path_set(&p, DP_PS_PREFILL);
    CHECK_EQ_INT(path_decide(&p, &o, 100, 200), DP_STAY);
    CHECK_EQ_INT(path_decide(&p, &o, 200, 200), DP_SWITCH_PROMPT_DONE);
    p.last_change = 0.01f;
    CHECK_EQ_INT(path_decide(&p, &o, 300, 1000), DP_STAY); /* early switch is off */
    o.early_switch = true;
    CHECK_EQ_INT(path_decide(&p, &o, 100, 1000), DP_STAY); /* below min_tokens */
    CHECK_EQ_INT(path_decide(&p, &o, 300, 1000), DP_SWITCH_STABLE);
    p.last_change = 0.5f;
    CHECK_EQ_INT(path_decide(&p, &o, 300, 1000), DP_STAY);
    p.repetition = 0.9f;
    CHECK_EQ_INT(path_decide(&p, &o, 300, 1000), DP_SWITCH_REPETITIVE);

    /* What a chunk end needs: queries captured where a switch may come, the
     * kept set measured only where the decision reads it. */
    CHECK(!path_may_switch(&p, &o, 100, 1000));  /* below min_tokens */
    CHECK(!path_may_switch(&p, &o, 1000, 1000)); /* the prompt's end: a migration */
    CHECK(path_may_switch(&p, &o, 300, 1000));
    CHECK(!path_wants_stability(&p, &o, 300, 1000)); /* repetition decides */
    p.repetition = 0.1f;
    CHECK(path_wants_stability(&p, &o, 300, 1000));
    CHECK(!path_wants_stability(&p, &o, 100, 1000));
    o.early_switch = false;
    CHECK(!path_may_switch(&p, &o, 300, 1000) && !path_wants_stability(&p, &o, 300, 1000));
    path_set(&p, DP_PS_DECODE);
    o.early_switch = true;
    CHECK(!path_may_switch(&p, &o, 300, 1000)); /* already on the decode path */

    T_DONE("path");
}
