/* hub_internal.h - shared between the files of src/hub: the libcurl handle
 * every request starts from and the HTTP statuses turned into sentences. */
#ifndef RC_HUB_INTERNAL_H
#define RC_HUB_INTERNAL_H

#include "hub/hub.h"

#include <curl/curl.h>

/* The endpoint without a trailing '/', and the token ("" for none). */
const char *hub__endpoint(const hub_config *cfg, char *buf, size_t cap);
const char *hub__token(const hub_config *cfg);

/* A libcurl handle for `url` with what every request needs: redirects
 * followed (http and https only), the token as a bearer header in *hdrs
 * (free with curl_slist_free_all; libcurl does not send it on to another
 * host after a redirect), a connect timeout and stall detection, proxies
 * from the environment.  NULL with RC_ENOMEM. */
CURL *hub__easy(const hub_config *cfg, const char *url, struct curl_slist **hdrs);

/* RC_EINVAL/RC_ENOTFOUND/RC_EIO with a sentence for an HTTP status that is
 * not a success, `what` naming the repository or file. */
int hub__http_error(const hub_config *cfg, const char *what, long status);

/* RC_EIO with libcurl's description of a failed transfer. */
int hub__curl_error(const char *what, CURLcode code, const char *errbuf);

#endif
