/* jv_json.c: cJSON trees as model/jinja.h values (a request's
 * chat_template_kwargs, dp-template's messages and kwargs). */
#include "jv_json.h"

#include <stdint.h>

static jv *convert(const cJSON *j, int depth, int max_depth, long *left)
{
    if (depth > max_depth || --*left < 0)
        return NULL;
    if (cJSON_IsNull(j))
        return jv_none();
    if (cJSON_IsBool(j))
        return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsString(j))
        return jv_str(j->valuestring);
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d > -9e15 && d < 9e15 && d == (double)(int64_t)d) /* range first: the cast of 1e20 is UB */
            return jv_int((int64_t)d);
        return jv_float(d);
    }
    jv *o = cJSON_IsArray(j) ? jv_list() : cJSON_IsObject(j) ? jv_dict() : NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        jv *v = convert(it, depth + 1, max_depth, left);
        if (cJSON_IsArray(j) ? jv_list_push(o, v) : jv_dict_set(o, it->string, v)) {
            jv_unref(o);
            return NULL;
        }
    }
    return o;
}

jv *jv_from_json(const cJSON *j, int max_depth, long *left)
{
    return convert(j, 0, max_depth, left);
}
