/* replay.c: runs a fuzz target over files and directories of inputs
 * without libFuzzer (any compiler): how `meson test` replays the committed
 * corpora, under ASan too. Exits non-zero if an input cannot be read; a
 * failing input aborts inside the target, naming itself first. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int one(const char *path, unsigned *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb)
                abort();
            buf = nb;
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    /* A copy of exactly len bytes, so ASan sees reads past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact)
        abort();
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    (*n)++;
    return 0;
}

static int walk(const char *path, unsigned *n)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s does not exist\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return one(path, n);
    DIR *d = opendir(path);
    if (!d)
        return 1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) && !rc) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        rc = walk(p, n);
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    unsigned n = 0;
    for (int i = 1; i < argc; i++)
        if (walk(argv[i], &n))
            return 1;
    printf("replay: %u inputs, no failure\n", n);
    return n ? 0 : 1;
}
