/* fuzz_frame_mdns.c - libFuzzer target for the mDNS packet parser
 * (cluster/mdns.h), which reads datagrams from anyone on the network.
 *
 * Parses the input; on success looks up keys in every TXT record and
 * writes every name parsed back into a packet, parses that again and checks
 * the name came back the same (the presentation form round-trips).
 * Seeds: fuzz/corpus/frame_mdns.
 */
#include "cluster/mdns.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mdns_packet p, q;
static uint8_t buf[MDNS_PKT_MAX];

static void roundtrip(const char *name)
{
    mdns_writer w;
    mdns_w_init(&w, buf, sizeof buf, 0, 0);
    mdns_w_question(&w, name, MDNS_A, MDNS_CLASS_IN);
    long n = mdns_w_finish(&w);
    if (n < 0)
        return;     /* e.g. the root name, which the writer does not write */
    if (mdns_parse(buf, (size_t)n, &q) != 0 || q.n_qs != 1 || !mdns_name_eq(q.qs[0].name, name))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (mdns_parse(data, size, &p) != 0)
        return 0;
    char v[256];
    for (int i = 0; i < p.n_rrs; i++) {
        const mdns_rr *r = &p.rrs[i];
        if (r->type == MDNS_TXT) {
            mdns_txt_get(r->rdata, r->n_rdata, "id", v, sizeof v);
            mdns_txt_get(r->rdata, r->n_rdata, "fp", v, sizeof v);
        }
        if (r->name[0])
            roundtrip(r->name);
        if (r->target[0])
            roundtrip(r->target);
    }
    for (int i = 0; i < p.n_qs; i++)
        if (p.qs[i].name[0])
            roundtrip(p.qs[i].name);
    return 0;
}
