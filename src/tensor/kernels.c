/* kernels.c - the active table of tensor functions, the one tensor_type_traits
 * returns.
 *
 * Until tensor_kernels_init runs, the active table is the reference table
 * itself, so every caller works without initialisation.  tensor_kernels_init
 * copies the reference entries into a table of its own and is where the
 * kernels of the CPU's instruction sets (chosen by a CPU probe) will replace
 * function pointers; for now it installs the reference code unchanged.
 */
#include "tensor/types.h"

#include <stddef.h>

static tensor_traits table[TT_COUNT];
static const tensor_traits *active;     /* NULL: use the reference table */

void tensor_kernels_init(void)
{
    for (int t = 0; t < TT_COUNT; t++)
        table[t] = *tensor_type_traits_ref(t);
    active = table;
}

const tensor_traits *tensor_type_traits(int type)
{
    if (type < 0 || type >= TT_COUNT)
        return NULL;
    return active ? &active[type] : tensor_type_traits_ref(type);
}
