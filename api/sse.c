/* sse.c: Server-Sent Events frames (sse.h). */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

char *sse_frame(const char *json, size_t n, size_t *len)
{
    static const char head[] = "data: ", tail[] = "\n\n";
    const size_t nh = sizeof head - 1, nt = sizeof tail - 1;
    char *s = malloc(nh + n + nt + 1);
    if (!s)
        return NULL;
    memcpy(s, head, nh);
    memcpy(s + nh, json, n);
    memcpy(s + nh + n, tail, nt + 1);
    if (len)
        *len = nh + n + nt;
    return s;
}

char *sse_frame_take(char *json, size_t *len)
{
    if (!json)
        return NULL;
    char *s = sse_frame(json, strlen(json), len);
    free(json);
    return s;
}
