/* types.c - the reference table of tensor types: names, block geometry and
 * the scalar functions of every type racimo computes with.
 *
 * Every GGUF type number below TT_COUNT has an entry, so a GGUF reader can
 * size the tensors of any file, even of types racimo cannot compute with
 * (those have a name and block geometry but no functions); numbers ggml
 * removed keep their old names with block_size 0.  The functions come from
 * quant_ref.c, quant_kref.c, quant_klow_ref.c and quant_iqref.c; kernels.c
 * keeps the patchable copy that tensor_type_traits returns.
 */
#include "tensor/types.h"

#include <stdint.h>
#include <stdio.h>

#include "tensor/quant_ref.h"

#define INFO(type, nm, bs, bytes) \
    [type] = { .name = nm, .block_size = bs, .block_bytes = bytes, .vec_dot_type = -1 }
#define REMOVED(num, nm) [num] = { .name = nm, .vec_dot_type = -1 }

/* Geometry of the types without reference code, as in ggml's type_traits
 * (ggml.c); types with code take theirs from their entry. */
static const tensor_traits info_only[TT_COUNT] = {
    REMOVED(4, "Q4_2"),
    REMOVED(5, "Q4_3"),
    INFO(TT_IQ2_XXS, "IQ2_XXS", QK_K, 66),
    INFO(TT_IQ2_XS,  "IQ2_XS",  QK_K, 74),
    INFO(TT_IQ3_XXS, "IQ3_XXS", QK_K, 98),
    INFO(TT_IQ1_S,   "IQ1_S",   QK_K, 50),
    INFO(TT_IQ3_S,   "IQ3_S",   QK_K, 110),
    INFO(TT_IQ2_S,   "IQ2_S",   QK_K, 82),
    INFO(TT_I8,      "I8",      1,    1),
    INFO(TT_I16,     "I16",     1,    2),
    INFO(TT_I32,     "I32",     1,    4),
    INFO(TT_I64,     "I64",     1,    8),
    INFO(TT_F64,     "F64",     1,    8),
    INFO(TT_IQ1_M,   "IQ1_M",   QK_K, 56),
    REMOVED(31, "Q4_0_4_4"),
    REMOVED(32, "Q4_0_4_8"),
    REMOVED(33, "Q4_0_8_8"),
    INFO(TT_TQ1_0,   "TQ1_0",   QK_K, 54),
    INFO(TT_TQ2_0,   "TQ2_0",   QK_K, 66),
    REMOVED(36, "IQ4_NL_4_4"),
    REMOVED(37, "IQ4_NL_4_8"),
    REMOVED(38, "IQ4_NL_8_8"),
};

static const tensor_traits *const ref_table[TT_COUNT] = {
    [TT_F32]  = &tensor__ref_f32,
    [TT_F16]  = &tensor__ref_f16,
    [TT_BF16] = &tensor__ref_bf16,
    [TT_Q4_0] = &tensor__ref_q4_0,
    [TT_Q4_1] = &tensor__ref_q4_1,
    [TT_Q5_0] = &tensor__ref_q5_0,
    [TT_Q5_1] = &tensor__ref_q5_1,
    [TT_Q8_0] = &tensor__ref_q8_0,
    [TT_Q8_1] = &tensor__ref_q8_1,
    [TT_Q2_K] = &tensor__ref_q2_K,
    [TT_Q3_K] = &tensor__ref_q3_K,
    [TT_Q4_K] = &tensor__ref_q4_K,
    [TT_Q5_K] = &tensor__ref_q5_K,
    [TT_Q6_K] = &tensor__ref_q6_K,
    [TT_Q8_K] = &tensor__ref_q8_K,
    [TT_IQ4_NL] = &tensor__ref_iq4_nl,
    [TT_IQ4_XS] = &tensor__ref_iq4_xs,
    [TT_MXFP4]  = &tensor__ref_mxfp4,
    [TT_Q4_0_R8] = &tensor__ref_q4_0_r8,
    [TT_Q4_K_R8] = &tensor__ref_q4_k_r8,
    [TT_Q8_0_R8] = &tensor__ref_q8_0_r8,
    [TT_Q6_K_R8] = &tensor__ref_q6_k_r8,
};

const tensor_traits *tensor_type_traits_ref(int type)
{
    if (type < 0 || type >= TT_COUNT)
        return NULL;
    return ref_table[type] ? ref_table[type] : &info_only[type];
}

int tensor_type_supported(int type)
{
    const tensor_traits *t = tensor_type_traits_ref(type);
    return t && t->to_float && t->dot_f32 && t->vec_dot;
}

const char *tensor_type_name(int type)
{
    /* per thread, so concurrent messages about bad types do not mix */
    static _Thread_local char unknown[24];
    const tensor_traits *t = tensor_type_traits_ref(type);
    if (t && t->name)
        return t->name;
    snprintf(unknown, sizeof unknown, "type %d", type);
    return unknown;
}

static int ascii_lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

static int name_equal(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (ascii_lower((unsigned char)*a) != ascii_lower((unsigned char)*b))
            return 0;
    return *a == *b;
}

int tensor_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < TT_COUNT; t++) {
        const tensor_traits *tt = tensor_type_traits_ref(t);
        if (tt->name && name_equal(tt->name, name))
            return t;
    }
    return -1;
}

size_t tensor_row_bytes(int type, int64_t n)
{
    const tensor_traits *t = tensor_type_traits_ref(type);
    if (!t || t->block_size <= 0 || n < 0 || n % t->block_size)
        return 0;
    uint64_t n_blocks = (uint64_t)(n / t->block_size);
    if (n_blocks > SIZE_MAX / t->block_bytes)
        return 0;
    return (size_t)n_blocks * t->block_bytes;
}
