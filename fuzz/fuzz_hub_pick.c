/* fuzz_hub_pick.c - libFuzzer target for a Hugging Face tree listing as a
 * hostile Hub or mirror may send it (src/hub/hub_pick.c): the input is the
 * listing's JSON, picked with no tag, with a tag and by file name.  A pick
 * that succeeds must give 1..HUB_MAX_FILES files whose names are plain file
 * names (no '/', not hidden, ending in .gguf), 64 hex digits or nothing as
 * sha256, sizes adding up to the total, and a set name of the same kind; a
 * failure must leave the plan empty.  Seeds: fuzz/corpus/hub_pick. */
#include "hub/hub.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_name(const char *n)
{
    size_t len = strlen(n);
    if (!len || n[0] == '.' || strchr(n, '/') || len < 5 || strcmp(n + len - 5, ".gguf"))
        abort();
}

static void pick(const char *json, const char *name, const char *file)
{
    hub_ref r;
    hub_plan p;
    if (hub_parse_ref(name, &r))
        abort();
    if (hub_pick(json, &r, file, &p)) {
        if (p.n_files)
            abort();
        return;
    }
    if (p.n_files < 1 || p.n_files > HUB_MAX_FILES)
        abort();
    uint64_t total = 0;
    for (int i = 0; i < p.n_files; i++) {
        check_name(p.files[i].name);
        size_t h = strlen(p.files[i].sha256);
        if (h && (h != 64 || strspn(p.files[i].sha256, "0123456789abcdef") != 64))
            abort();
        total += p.files[i].size;
    }
    check_name(p.set_name);
    if (total != p.total_bytes)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    if (!json)
        return 0;
    memcpy(json, data, size);
    json[size] = 0;
    pick(json, "hf.co/org/repo", NULL);
    pick(json, "hf.co/org/repo:Q8_0", NULL);
    pick(json, "org/repo", "m-00001-of-00002.gguf");
    free(json);
    return 0;
}
