/* gguf.h - reading and writing GGUF files (versions 2 and 3, little-endian).
 *
 * Reading: gguf_open maps the file read-only and parses the header, the
 * key/value metadata and the tensor infos.  Nothing of the tensor data is
 * copied: a tensor's `data` points into the mapping.  Every count, length,
 * offset and dimension is treated as hostile: it is checked against what
 * remains of the file and against hard limits before anything is allocated,
 * and a failure's detail (rc_errmsg) names the file, the byte offset and the
 * problem.  gguf_parse does the same on a buffer (for the fuzzer and tests).
 *
 * gguf_open_meta maps only the file's head (header, metadata, tensor infos),
 * so that a node serving a few layers of a large model spends address space
 * and memory on those layers only; gguf_map_tensors then maps the data of
 * the tensors it needs, one mapping per run of nearby tensors.
 *
 * Strings in the file are not NUL-terminated; values give pointer + length
 * into the mapping.  Keys and tensor names are copied into NUL-terminated
 * strings (there are few of them); string arrays (tokenizer vocabularies,
 * 100k+ entries) are not copied.
 *
 * Writing: gguf_writer collects metadata and tensor infos, then writes the
 * file in one pass, asking a callback for each tensor's bytes so that models
 * larger than memory can be written.
 */
#ifndef RC_GGUF_H
#define RC_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Value types, numbered as in the GGUF specification. */
enum gguf_vtype {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12, GGUF_VTYPE_COUNT = 13
};

typedef struct { const char *ptr; uint64_t len; } gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    uint32_t type;                 /* enum gguf_vtype */
    union {
        uint64_t u;                /* UINT8..UINT64 and BOOL */
        int64_t  i;                /* INT8..INT64 */
        double   f;                /* FLOAT32, FLOAT64 */
        gguf_str s;                /* STRING */
        struct {
            uint32_t elem_type;    /* enum gguf_vtype of every element */
            uint64_t n;            /* element count */
            const void *raw;       /* scalar elements: packed little-endian
                                      bytes in the mapping */
            gguf_value *items;     /* STRING or ARRAY elements: n parsed
                                      values (NULL for scalar elements) */
        } arr;
    } v;
};

typedef struct {
    const char *key;               /* NUL-terminated copy */
    gguf_value  value;
} gguf_kv;

typedef struct {
    const char *name;              /* NUL-terminated copy */
    uint32_t    n_dims;            /* 1..4 */
    int64_t     ne[GGUF_MAX_DIMS]; /* elements per dim, ne[0] contiguous;
                                      unused dims are 1 */
    uint32_t    type;              /* enum tensor_type */
    uint64_t    offset;            /* from the start of the data section */
    uint64_t    size_bytes;
    const void *data;              /* into a mapping; NULL after gguf_open_meta
                                      until gguf_map_tensors maps it */
    uint64_t    file_offset;       /* absolute offset of the data in the file
                                      (the file of part `part` for a split set) */
    uint32_t    part;              /* split set: the part holding the data
                                      (parts[part]); 0 for one file */
} gguf_tensor;

typedef struct gguf_file {
    char       *path;              /* for messages */
    uint32_t    version;
    uint64_t    n_kv;
    gguf_kv    *kv;
    uint64_t    n_tensors;
    gguf_tensor *tensors;
    uint64_t    alignment;
    uint64_t    data_offset;       /* start of the tensor data section */
    const uint8_t *base;           /* the file's bytes from 0: all of them after
                                      gguf_open, gguf_parse and a gguf_map_tensors
                                      that mapped every tensor; only the head
                                      [0, data_offset) after gguf_open_meta;
                                      the first part's for a split set */
    uint64_t    size_bytes;        /* of the whole file (all parts together
                                      for a split set) */
    void       *map_handle;        /* owned mappings (NULL for gguf_parse and
                                      split sets) */
    /* A split set opened by its first part: every part as a file of its
     * own (owned); kv, alignment, data_offset and base are the first
     * part's, tensors those of every part in part order.  0 and NULL for
     * one file. */
    uint32_t    n_parts;
    struct gguf_file **parts;
    /* Private to gguf_read.c: keys and tensor names sorted, for look-up. */
    struct gguf__index *kv_index;
    struct gguf__index *tensor_index;
} gguf_file;

/* Hard limits against hostile files (a real file is far below each). */
#define GGUF_MAX_KV         (1u << 20)
#define GGUF_MAX_TENSORS    (1u << 20)
#define GGUF_MAX_STRING     (1u << 30)
#define GGUF_MAX_ARRAY_DEPTH 8

/* Maps and parses `path`.  On success *out owns the mapping; free with
 * gguf_close.  A file with split.count > 1 is the first part of a split
 * model (NAME-00001-of-0000N.gguf): the other parts are opened from the
 * same folder by their names and *out is the whole model (n_parts, parts),
 * after checking every part's split.no, split.count and
 * split.tensors.count, the tensor total and that no tensor name is used
 * twice; a missing or wrong part is RC_ENOTFOUND / RC_EFORMAT naming its
 * file, and any other part given here is RC_EFORMAT naming the first.  On failure *out is NULL and the return is
 *   RC_EIO          the file cannot be opened or mapped (or is a directory),
 *   RC_EFORMAT      malformed: truncated, bad magic, bad type, inconsistent
 *                   sizes or offsets, duplicates,
 *   RC_EUNSUPPORTED a version other than 2 and 3 (1, 4, ...), a big-endian
 *                   file, an unknown tensor type (the detail names it),
 *   RC_ELIMIT       a count, string length or nesting depth beyond the
 *                   GGUF_MAX_* limits,
 *   RC_ENOMEM,
 * with a detail like "model.gguf: at byte 8: header: tensor count
 * 4294967296 exceeds the limit 1048576".  Thread safe (no shared state). */
int gguf_open(const char *path, gguf_file **out);

/* Parses a GGUF image already in memory.  `data` must outlive the result
 * (nothing is copied but keys and tensor names).  `name` is used in
 * messages (NULL: "<memory>").  Errors as gguf_open, without RC_EIO. */
int gguf_parse(const uint8_t *data, size_t size, const char *name, gguf_file **out);

/* Like gguf_open (same checks, same errors, same messages, split sets
 * too) but maps only the head of the file (of each part), growing the mapping while the parse needs more: every
 * tensor's `data` is NULL until gguf_map_tensors.  The file stays open for
 * that.  Thread safe. */
int gguf_open_meta(const char *path, gguf_file **out);

/* Tensors closer than this share one mapping (fewer mappings, a few unused
 * pages mapped). */
#define GGUF_MAP_MERGE_GAP (1u << 20)

/* Maps the data of the tensors with need[i] set (need has n_tensors
 * entries) that are not mapped yet, one page-aligned mapping per run of
 * tensors less than GGUF_MAP_MERGE_GAP apart, and sets their `data`.  When
 * every tensor is needed the whole file is mapped once and `base` then
 * covers it.  A file from gguf_open or gguf_parse has everything mapped
 * already (0).  RC_ENOMEM when the address space is exhausted, RC_EIO;
 * the detail names the file.  Not thread safe on one file. */
int gguf_map_tensors(gguf_file *f, const bool *need);

void gguf_close(gguf_file *f);     /* accepts NULL and half-built files */

/* The files of f: 1 for one file, n_parts for a split set; gguf_file_at(f,
 * i) is file i as a gguf_file of its own (f itself for one file), for code
 * that reads bytes through `base` (prefaulting) or by file offset. */
static inline uint32_t gguf_n_files(const gguf_file *f) { return f->n_parts ? f->n_parts : 1; }
static inline const gguf_file *gguf_file_at(const gguf_file *f, uint32_t i)
{
    return f->n_parts ? f->parts[i] : f;
}

/* Metadata look-up; NULL if absent. */
const gguf_value *gguf_get(const gguf_file *f, const char *key);

/* Typed getters: 0 on success; RC_ENOTFOUND if absent; RC_EFORMAT (with a
 * detail naming the key) if the stored type does not convert; RC_ERANGE if
 * the type converts but the value does not fit (u32 from a negative i32, a
 * u64 above UINT32_MAX, a float64 beyond the float range).  Integer getters
 * accept any integer type (not bool) whose value fits; gguf_get_f32 accepts
 * floats and integers; gguf_get_bool only bool; gguf_get_str returns a
 * pointer into the mapping, not terminated.  *out is untouched on failure. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);

/* An array value's element count and type (RC_EFORMAT if not an array). */
int gguf_get_arr(const gguf_file *f, const char *key, uint32_t *elem_type, uint64_t *n);

/* Element i of a scalar array, converted as the typed getters do:
 * RC_EFORMAT if `arr` is not an array of integers (of numbers for f64),
 * RC_ERANGE if i >= n or the value does not fit an int64. */
int gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out);
int gguf_arr_f64(const gguf_value *arr, uint64_t i, double *out);

/* Tensor look-up by name; NULL if absent. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

const char *gguf_vtype_name(uint32_t type);

/* ---- writing ---- */

typedef struct gguf_writer gguf_writer;

/* Fills `dst` (exactly `size_bytes`) with tensor `index`'s data, in the order
 * tensors were added.  Returns 0, or a negative code to abort the write (the
 * writer returns that code).  A NULL fill writes zeros. */
typedef int (*gguf_fill_fn)(void *ctx, uint64_t index, void *dst, uint64_t size_bytes);

gguf_writer *gguf_writer_new(void);            /* NULL on out of memory */
void gguf_writer_free(gguf_writer *w);         /* accepts NULL */

/* Metadata setters: the key is copied; a key set twice keeps the last value
 * at the first position.  All return 0 or RC_ENOMEM (RC_EINVAL for a NULL
 * key or string). */
int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Arrays: values are copied. */
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
/* A raw value of any type, for tests of unusual files: `value` is copied
 * deeply (strings and nested arrays included).  RC_EINVAL for a type number
 * >= GGUF_VTYPE_COUNT, an array item whose type is not the array's
 * elem_type, NULL data with a nonzero count, or nesting deeper than 32. */
int gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *value);

/* Declares a tensor (name copied).  Its size is computed from the type and
 * dims; RC_EINVAL if ne[0] is not a multiple of the type's block size, the
 * type is unknown, n_dims is not 1..4, a dim is negative, the size
 * overflows, or the name is already used. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const int64_t *ne);

/* Writes version 3 to `path` (via `path`.tmp renamed into place, so a
 * reader never sees half a file; no fsync).  Tensors are placed at multiples
 * of the alignment: `general.alignment` if set (it must be a uint32 power of
 * two, else RC_EINVAL), otherwise 32 and the key is not written.  The data
 * section starts at the first aligned offset after the tensor infos; the file
 * ends right after the last tensor.  `fill` is called once per tensor in
 * order.  Returns 0, RC_EIO (detail names the path), RC_ENOMEM, RC_EINVAL or
 * fill's code.  The writer may be written again afterwards. */
int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx);

/* The file's head only, with the data section left a hole of its size
 * (ftruncate: a sparse file on file systems that have them). */
int gguf_writer_write_head(gguf_writer *w, const char *path);

/* The head alone, [0, data offset), into a malloc'd buffer (free with
 * rc_free), with each tensor's absolute offset in the file the writer
 * would write (offsets: one per tensor added, or NULL) and that file's
 * size.  RC_ENOMEM, RC_EINVAL. */
int gguf_writer_head_mem(gguf_writer *w, uint8_t **head, size_t *head_bytes, uint64_t *offsets,
                         uint64_t *total_bytes);

/* Same, into a malloc'd buffer (for tests and fuzz seeds); free with rc_free. */
int gguf_writer_write_mem(gguf_writer *w, gguf_fill_fn fill, void *ctx,
                          uint8_t **out, size_t *out_size);

/* ---- split models (gguf_split.c, gguf_set.c) ---- */

#define GGUF_SPLIT_MAX 99999

/* When the file name at the end of `path` is NAME-NNNNN-of-MMMMM.gguf
 * (five digits each, 1 <= N <= M): true, *stem_len the length of `path` up
 * to NAME's end, *no = N - 1 and *count = M.  Else false. */
bool gguf_split_name(const char *path, size_t *stem_len, uint32_t *no, uint32_t *count);

/* The path of part `no` (from 0) of `count` beside part `path` (a name
 * gguf_split_name accepts).  RC_EINVAL (not a part's name), RC_ELIMIT
 * (cap too small). */
int gguf_split_path(const char *path, uint32_t no, uint32_t count, char *out, size_t cap);

/* The first part of a split set named `name` in folder `dir`
 * (dir/NAME-00001-of-0000N.gguf) into out; false when there is none (or
 * cap is too small).  Reads the folder. */
bool gguf_split_find(const char *dir, const char *name, char *out, size_t cap);

/* The bytes of every part of the set whose first part is `path`, found by
 * name (stat only, no parse): RC_ENOTFOUND naming the first part missing. */
int gguf_split_set_bytes(const char *path, uint64_t *bytes);

/* Writes f (every tensor mapped: gguf_open) as n_parts files
 * PREFIX-00001-of-0000N.gguf..., the tensors in order and spread evenly,
 * the metadata in the first, split.no/split.count/split.tensors.count in
 * each (llama.cpp's layout).  0, or the writer's codes. */
int gguf_split_write(const gguf_file *f, int n_parts, const char *prefix);

/* Joins the parts of a split model (paths in part order) into one GGUF file
 * at `out` (written as `out`.tmp, then renamed): the first part's metadata
 * without the split.* keys, every part's tensors in order.  RC_EFORMAT when
 * a part is not the one expected (its number, the count, the tensor total,
 * a tensor name used twice), the detail naming the file; gguf_open's codes
 * for a part that does not parse; RC_EIO for the output. */
int gguf_join(const char *const *paths, int n, const char *out);

/* The file gguf_join would write from split set `set` (gguf_open or
 * gguf_open_meta of its first part), byte for byte, described without
 * writing it: its head, and where each of set's tensors lies in it (the
 * bytes between tensors are zeros).  A node serves a set to its peers as
 * this one file, so the set and its joined file have one content digest. */
typedef struct {
    uint8_t  *head;                /* [0, head_bytes) of the joined file */
    size_t    head_bytes;
    uint64_t *offset;              /* [set->n_tensors]: absolute offsets */
    uint64_t  size_bytes;          /* of the joined file */
} gguf_joined;

/* RC_EINVAL (not a set), RC_ENOMEM, the writer's codes. */
int gguf_joined_view(const gguf_file *set, gguf_joined *out);
void gguf_joined_free(gguf_joined *j);     /* accepts a zeroed struct */

#endif
