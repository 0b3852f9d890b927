/* sse.h: Server-Sent Events framing, the one writer of the frames a
 * streamed response is made of ("data: <json>\n\n", and "data: [DONE]\n\n"
 * at the end, as OpenAI streams them). The rest of api/ hands it JSON. */
#ifndef DP_API_SSE_H
#define DP_API_SSE_H

#include <stddef.h>

/* A frame of a constant JSON text, at compile time. */
#define SSE_FRAME(json) "data: " json "\n\n"
/* The frame that ends a stream. */
#define SSE_DONE SSE_FRAME("[DONE]")

/* A new frame of json[0..n) (NUL-terminated; *len: its length without the
 * NUL), or NULL without memory. */
char *sse_frame(const char *json, size_t n, size_t *len);
/* sse_frame of a JSON string it takes (and frees): NULL in, NULL out. */
char *sse_frame_take(char *json, size_t *len);

#endif
