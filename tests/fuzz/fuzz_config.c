/* fuzz_config.c: the config file parser and the flag parser. The input is a
 * config file up to the first NUL byte, then NUL-separated flags. Any input
 * must be accepted or refused with one line naming where, and whatever was
 * accepted must pass through --print-config and parse back to the same. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dp.h"
#include "conf/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    dp_log_set_level(DP_LOG_ERROR + 0); /* the duplicate-key warnings are expected */
    return 0;
}

/* A file with these bytes (memfd: nothing touches the disk). */
static int write_file(const void *p, size_t n, char *path, size_t pathsz)
{
    int fd = memfd_create("fuzz-config", 0);
    if (fd < 0)
        abort();
    if (n && write(fd, p, n) != (ssize_t)n)
        abort();
    snprintf(path, pathsz, "/proc/self/fd/%d", fd);
    return fd;
}

static void one_line(const char *err)
{
    if (!err[0] || strchr(err, '\n')) {
        fprintf(stderr, "not one line: '%s'\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *end = memchr(data, 0, size);
    size_t file_len = end ? (size_t)(end - (const char *)data) : size;
    char path[64], err[DP_ERRLEN];
    dp_config c;
    if (config_defaults(&c))
        abort();
    int fd = write_file(data, file_len, path, sizeof path);
    err[0] = 0;
    int rc = config_load_file(&c, path, true, err, sizeof err);
    close(fd);
    if (rc) {
        one_line(err);
        config_destroy(&c);
        return 0;
    }
    /* The flags: argv[1..] from the NUL-separated rest (at most 16). */
    char *args = NULL;
    char *argv[18] = {"dualpathd"};
    int argc = 1;
    if (end) {
        size_t n = size - file_len - 1;
        args = malloc(n + 1);
        memcpy(args, end + 1, n);
        args[n] = 0;
        for (char *p = args; p < args + n && argc < 17; p += strlen(p) + 1)
            argv[argc++] = p;
    }
    argv[argc] = NULL;
    dp_config_cli cli = {0};
    err[0] = 0;
    rc = config_parse_args(&c, argc, argv, &cli, err, sizeof err);
    if (!rc) {
        err[0] = 0;
        rc = config_validate(&c, err, sizeof err);
    }
    if (rc) {
        one_line(err);
    } else {
        /* Round trip: the printed configuration reads back to itself. */
        char *text = NULL, *text2 = NULL;
        size_t tl = 0, tl2 = 0;
        FILE *f = open_memstream(&text, &tl);
        config_print(&c, f);
        fclose(f);
        dp_config c2;
        if (config_defaults(&c2))
            abort();
        fd = write_file(text, tl, path, sizeof path);
        if (config_load_file(&c2, path, true, err, sizeof err)) {
            fprintf(stderr, "printed configuration does not parse: %s\n%s", err, text);
            abort();
        }
        close(fd);
        f = open_memstream(&text2, &tl2);
        config_print(&c2, f);
        fclose(f);
        if (tl != tl2 || memcmp(text, text2, tl)) {
            fprintf(stderr, "round trip differs:\n%s\n----\n%s", text, text2);
            abort();
        }
        free(text);
        free(text2);
        config_destroy(&c2);
    }
    free(args);
    config_destroy(&c);
    return 0;
}
