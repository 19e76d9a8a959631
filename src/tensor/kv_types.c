/* kv_types.c - KV cache element types: names, row sizes, writing a row. */
#include "kv_types.h"

#include <string.h>
#include <strings.h>

bool kv_type_ok(int type) { return type == TT_F32 || type == TT_F16 || type == TT_Q8_0; }

int kv_type_parse(const char *name, int *type)
{
    static const struct { const char *name; int type; } names[] = {
        { "f32", TT_F32 }, { "f16", TT_F16 }, { "q8_0", TT_Q8_0 },
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(name, names[i].name)) {
            *type = names[i].type;
            return 0;
        }
    return -1;
}

const char *kv_type_name(int type)
{
    return type == TT_F32 ? "f32" : type == TT_F16 ? "f16" : type == TT_Q8_0 ? "q8_0" : "?";
}

size_t kv_row_bytes(int type, size_t n)
{
    switch (type) {
    case TT_F32: return n * sizeof(float);
    case TT_F16: return n * sizeof(fp16_t);
    case TT_Q8_0: return (n + QK8_0 - 1) / QK8_0 * sizeof(block_q8_0);
    default: return 0;
    }
}

void kv_row_from_float(int type, const float *src, void *dst, int n)
{
    if (type == TT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const tensor_traits *t = tensor_type_traits(type);
    const int whole = type == TT_Q8_0 ? n / QK8_0 * QK8_0 : n;
    t->from_float(src, dst, whole);
    if (whole < n) {
        /* the last block from a zero-padded copy: padding quantises to 0 */
        float tail[QK8_0] = { 0 };
        memcpy(tail, src + whole, (size_t)(n - whole) * sizeof(float));
        t->from_float(tail, (block_q8_0 *)dst + whole / QK8_0, QK8_0);
    }
}
