/* web_assets.h - the dashboard's files (web/), built into the binary by
 * tools/web_embed.c (the generated file is build/<kind>/gen/web_assets.c).
 */
#ifndef RC_API_WEB_ASSETS_H
#define RC_API_WEB_ASSETS_H

#include <stddef.h>

typedef struct {
    const char *name;               /* base name: served as /ui/<name> */
    const char *content_type;
    const unsigned char *data;      /* len bytes (and a NUL after them) */
    size_t len;
    const char *etag;               /* quoted hash of the bytes, as the header carries it */
} web_asset;

extern const web_asset web_assets[];
extern const int web_n_assets;

#endif
