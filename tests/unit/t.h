/* t.h: the unit tests' tiny check macros. A failed check prints file:line and
 * the expression and exits 1, so a test can never pass by accident. */
#ifndef DP_TESTS_T_H
#define DP_TESTS_T_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* One count per test program, however many files it has: each file's weak
 * definition is the same object once linked. */
extern int t_checks;
__attribute__((weak)) int t_checks;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, "\n");                                                  \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                          \
    CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

#define CHECK_NEAR(a, b, tol)                                                       \
    CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)",  \
              (double)(a), (double)(b), (double)(tol))

#define T_DONE(name)                                                                \
    do {                                                                            \
        printf("%s: %d checks passed\n", name, t_checks);                           \
        return 0;                                                                   \
    } while (0)

#endif
