/* parse.c: the value parsers of conf/config.h that know nothing of the option
 * table: sizes, durations, integer lists and listen addresses. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "common/dp.h"

/* Parses "123", "1.5" (digits only: strtod would also take "inf", "0x1p3" and
 * leading spaces, none of which belong in a config). The integer part is kept
 * exact so that byte counts above 2^53 survive. */
static int parse_decimal(const char *s, uint64_t *ip, double *frac, const char **end)
{
    const char *p = s;
    uint64_t v = 0;
    bool digits = false;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return DP_ERANGE;
        v = v * 10 + d;
        digits = true;
        p++;
    }
    double f = 0;
    if (*p == '.') {
        p++;
        double scale = 0.1;
        while (isdigit((unsigned char)*p)) {
            f += (*p - '0') * scale;
            scale *= 0.1;
            digits = true;
            p++;
        }
    }
    if (!digits)
        return DP_EINVAL;
    *ip = v;
    *frac = f;
    *end = p;
    return 0;
}

int config_parse_size(const char *s, uint64_t *out, char *err, size_t errsz)
{
    static const struct {
        const char *suffix;
        int shift;
    } units[] = {
        {"", 0},     {"b", 0},     {"k", 10},    {"kb", 10},  {"kib", 10}, {"m", 20},
        {"mb", 20},  {"mib", 20},  {"g", 30},    {"gb", 30},  {"gib", 30}, {"t", 40},
        {"tb", 40},  {"tib", 40},
    };
    uint64_t ip;
    double frac;
    const char *p;
    int rc = parse_decimal(s, &ip, &frac, &p);
    if (rc == DP_ERANGE)
        return dp_err(err, errsz, DP_ERANGE, "%s is too large", s);
    if (rc)
        return dp_err(err, errsz, DP_EINVAL, "'%s' is not a size (e.g. 1024, 512KiB, 2GiB, 1.5G)",
                      s);
    while (*p == ' ')
        p++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) != 0)
            continue;
        int sh = units[i].shift;
        if (sh && ip > (UINT64_MAX >> sh))
            return dp_err(err, errsz, DP_ERANGE, "%s is too large", s);
        /* A fraction of a byte is dropped: 0.1G is 107374182 bytes. */
        double fb = frac * (double)((uint64_t)1 << sh);
        uint64_t v = (ip << sh) + (uint64_t)fb;
        if (v < (ip << sh))
            return dp_err(err, errsz, DP_ERANGE, "%s is too large", s);
        *out = v;
        return 0;
    }
    return dp_err(err, errsz, DP_EINVAL,
                  "'%s': unknown size suffix '%s' (use B, KiB, MiB, GiB or TiB)", s, p);
}

int config_parse_duration(const char *s, int64_t *ms, char *err, size_t errsz)
{
    static const struct {
        const char *suffix;
        double ms;
    } units[] = {
        {"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000},
    };
    uint64_t ip;
    double frac;
    const char *p;
    int rc = parse_decimal(s, &ip, &frac, &p);
    if (rc == DP_ERANGE || (rc == 0 && ip > (uint64_t)1 << 40))
        return dp_err(err, errsz, DP_ERANGE, "%s is too long", s);
    if (rc)
        return dp_err(err, errsz, DP_EINVAL,
                      "'%s' is not a duration (e.g. 500ms, 30s, 5min, 1h; a bare number is seconds)",
                      s);
    while (*p == ' ')
        p++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) != 0)
            continue;
        /* < 2^40 * 3.6e6 < 2^62: no overflow. Sub-millisecond parts are dropped. */
        *ms = (int64_t)(((double)ip + frac) * units[i].ms);
        return 0;
    }
    return dp_err(err, errsz, DP_EINVAL, "'%s': unknown duration unit '%s' (use ms, s, min or h)",
                  s, p);
}

int config_parse_int_list(const char *s, int *out, int cap, int *n, char *err, size_t errsz)
{
    int count = 0;
    const char *p = s;
    while (*p == ' ')
        p++;
    while (*p) {
        if (!isdigit((unsigned char)*p))
            return dp_err(err, errsz, DP_EINVAL,
                          "'%s' is not a list of integers (e.g. \"0,1\")", s);
        long v = 0;
        while (isdigit((unsigned char)*p)) {
            v = v * 10 + (*p - '0');
            if (v > 65535)
                return dp_err(err, errsz, DP_ERANGE, "'%s': a value is out of range [0, 65535]",
                              s);
            p++;
        }
        if (count >= cap)
            return dp_err(err, errsz, DP_ERANGE, "'%s' has more than %d values", s, cap);
        if (out)
            out[count] = (int)v;
        count++;
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
            while (*p == ' ')
                p++;
            if (!*p)
                return dp_err(err, errsz, DP_EINVAL, "'%s' ends with a comma", s);
        } else if (*p) {
            return dp_err(err, errsz, DP_EINVAL, "'%s' is not a list of integers (e.g. \"0,1\")",
                          s);
        }
    }
    *n = count;
    return 0;
}

/* A DNS name: labels of letters, digits and '-', separated by dots. */
static bool is_hostname(const char *h)
{
    size_t len = strlen(h), label = 0;
    if (len == 0 || len > 253)
        return false;
    for (const char *p = h; *p; p++) {
        if (*p == '.') {
            if (label == 0)
                return false;
            label = 0;
        } else if (isalnum((unsigned char)*p) || (*p == '-' && label > 0)) {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return label > 0 && h[len - 1] != '-';
}

int config_parse_listen(const char *s, char *host, size_t hostsz, int *port, char *unix_path,
                        size_t unixsz, char *err, size_t errsz)
{
    if (hostsz)
        host[0] = '\0';
    if (unixsz)
        unix_path[0] = '\0';
    *port = -1;

    if (strncmp(s, "unix:", 5) == 0) {
        const char *path = s + 5;
        /* sun_path bounds the path for every caller, whatever its buffer. */
        size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
        if (!*path)
            return dp_err(err, errsz, DP_EINVAL, "'%s': empty socket path", s);
        if (strlen(path) >= max || strlen(path) >= unixsz)
            return dp_err(err, errsz, DP_ERANGE, "'%s': socket path is longer than %zu bytes", s,
                          (max < unixsz ? max : unixsz) - 1);
        memcpy(unix_path, path, strlen(path) + 1);
        return 0;
    }

    const char *colon, *h = s;
    size_t hlen;
    if (*s == '[') {
        const char *rb = strchr(s, ']');
        if (!rb)
            return dp_err(err, errsz, DP_EINVAL, "'%s': missing ']' after the IPv6 address", s);
        h = s + 1;
        hlen = (size_t)(rb - h);
        if (rb[1] != ':')
            return dp_err(err, errsz, DP_EINVAL, "'%s': expected ':PORT' after ']'", s);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return dp_err(err, errsz, DP_EINVAL, "'%s': expected HOST:PORT, [IPv6]:PORT or "
                                                 "unix:/PATH", s);
        if (memchr(s, ':', (size_t)(colon - s)))
            return dp_err(err, errsz, DP_EINVAL,
                          "'%s': an IPv6 address needs brackets ([::1]:8080)", s);
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0)
        return dp_err(err, errsz, DP_EINVAL,
                      "'%s': missing host (0.0.0.0 or [::] listen on every address)", s);
    if (hlen >= hostsz || hlen >= 256)
        return dp_err(err, errsz, DP_ERANGE, "'%s': host name too long", s);
    char hbuf[256];
    memcpy(hbuf, h, hlen);
    hbuf[hlen] = '\0';

    if (*s == '[') {
        unsigned char a6[16];
        if (inet_pton(AF_INET6, hbuf, a6) != 1)
            return dp_err(err, errsz, DP_EINVAL, "'%s': '%s' is not an IPv6 address", s, hbuf);
    } else if (!is_hostname(hbuf)) {
        return dp_err(err, errsz, DP_EINVAL, "'%s': '%s' is not a host name or IPv4 address", s,
                      hbuf);
    } else if (isdigit((unsigned char)hbuf[hlen - 1])) {
        /* All-numeric names are addresses: catch 300.1.2.3 here rather than at bind. */
        unsigned char a4[4];
        if (inet_pton(AF_INET, hbuf, a4) != 1)
            return dp_err(err, errsz, DP_EINVAL, "'%s': '%s' is not an IPv4 address", s, hbuf);
    }

    const char *ps = colon + 1;
    long pv = 0;
    if (!*ps)
        return dp_err(err, errsz, DP_EINVAL, "'%s': missing port", s);
    for (const char *p = ps; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return dp_err(err, errsz, DP_EINVAL, "'%s': port '%s' is not a number", s, ps);
        pv = pv * 10 + (*p - '0');
        if (pv > 65535)
            return dp_err(err, errsz, DP_ERANGE, "'%s': port %s is out of range [0, 65535]", s,
                          ps);
    }
    memcpy(host, hbuf, hlen + 1);
    *port = (int)pv;
    return 0;
}
