/* cpu_dispatch.c: which build of cpu_kern.c this process runs. The best level
 * the CPU (and the OS, for the wide registers) supports, unless DP_CPU_LEVEL
 * asks for a lower one (tests run the AVX2 kernels on AVX-512 machines that
 * way). Chosen once, before the first backend exists, and logged. */
#include <pthread.h>
#ifdef DP_CPU_X86_LEVELS
#include <cpuid.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "cpu_internal.h"

static const cpu_kern *chosen;
static bool exact;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Levels from the best down; the first the machine supports is the default. */
struct level {
    const char *name;
    const cpu_kern *k;
    bool (*supported)(void);
};

#ifdef DP_CPU_X86_LEVELS
/* F16C by cpuid (leaf 1, ECX bit 29): clang does not know "f16c" as a
 * __builtin_cpu_supports name. Its state is AVX's, which the avx2 check
 * below already requires the OS to save. */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static bool has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

/* The AVX-512 level is built with AVX2 too (kernels/meson.build). */
static bool has_avx512(void)
{
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}
#endif

static bool always(void) { return true; }

static const struct level levels[] = {
#ifdef DP_CPU_X86_LEVELS
    {"avx512", &cpu_kern_avx512, has_avx512},
    {"avx2", &cpu_kern_avx2, has_avx2},
#endif
    {"baseline", &cpu_kern_baseline, always},
};
#define N_LEVELS (sizeof levels / sizeof levels[0])

static void choose(void)
{
    const char *want = getenv("DP_CPU_LEVEL");
    const char *e = getenv("DP_CPU_EXACT");
    exact = e && *e && strcmp(e, "0") != 0;
    size_t best = 0;
    while (!levels[best].supported())
        best++;
    chosen = levels[best].k;
    if (!want || !*want || !strcmp(want, "auto"))
        return;
    for (size_t i = 0; i < N_LEVELS; i++) {
        if (strcmp(want, levels[i].name))
            continue;
        if (i < best) {
            dp_log(DP_LOG_WARN, "DP_CPU_LEVEL=%s: this CPU lacks it; using %s", want, chosen->name);
            return;
        }
        chosen = levels[i].k;
        return;
    }
    char names[64] = "auto";
    for (size_t i = 0; i < N_LEVELS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), ", %s", levels[i].name);
    dp_log(DP_LOG_WARN, "DP_CPU_LEVEL=%s is not a level of this build (%s); using %s", want, names,
           chosen->name);
}

const cpu_kern *cpu_kern_level(const char *name)
{
    for (size_t i = 0; i < N_LEVELS; i++)
        if (!strcmp(name, levels[i].name))
            return levels[i].supported() ? levels[i].k : NULL;
    return NULL;
}

const cpu_kern *cpu_kern_get(void)
{
    pthread_once(&once, choose);
    return chosen;
}

bool cpu_exact_get(void)
{
    pthread_once(&once, choose);
    return exact;
}
