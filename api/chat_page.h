/* chat_page.h: the chat page served at / (api/chat_page.c). */
#ifndef DP_API_CHAT_PAGE_H
#define DP_API_CHAT_PAGE_H

#include <stddef.h>

extern const char dp_chat_page[];
extern const size_t dp_chat_page_len;

#endif
