/* jv_json.h: JSON (cJSON) as the values a chat template is rendered with
 * (model/jinja.h): the one conversion the API, dp-template and the fuzz
 * target share. */
#ifndef DP_API_JV_JSON_H
#define DP_API_JV_JSON_H

#include <cjson/cJSON.h>

#include "model/jinja.h"

/* j as a value: null, bools, strings, numbers (cJSON keeps no int/float
 * distinction: a whole number within +-9e15 is an int), arrays and objects.
 * NULL when nested deeper than max_depth, when it holds more than *left
 * values (each value takes one from *left), or out of memory. */
jv *jv_from_json(const cJSON *j, int max_depth, long *left);

#endif
