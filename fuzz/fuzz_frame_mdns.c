/* fuzz_frame_mdns.c - libFuzzer target for the mDNS packet parser
 * (cluster/mdns.h), which reads datagrams from anyone on the network.
 *
 * Parses the input; on success looks up keys in every TXT record and
 * writes every name parsed back into a packet, parses that again and checks
 * the name came back the same (the presentation form round-trips); puts
 * every A record through the acceptance rules of discovery and every name
 * through its rate limit (mdns_guard.h), which must always decide.
 * Seeds: fuzz/corpus/frame_mdns.
 */
#include "cluster/mdns.h"
#include "cluster/mdns_guard.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mdns_packet p, q;
static uint8_t buf[MDNS_PKT_MAX];
static mdns_rate rate;
static const mdns_iface ifs[2] = { { 2, 0x0a4d0001, 0xffffff00 }, { 3, 0xc0a80105, 0xffff0000 } };

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
        if (r->type == MDNS_A) {
            uint32_t a = (uint32_t)r->addr[0] << 24 | (uint32_t)r->addr[1] << 16 |
                         (uint32_t)r->addr[2] << 8 | r->addr[3];
            int v = mdns_guard_addr(ifs, 2, (int)(r->ttl % 4), a);
            if (v < MDNS_OK || v >= MDNS_N_VERDICTS || !mdns_guard_why(v))
                abort();
        }
        mdns_rate_allow(&rate, r->name, (uint64_t)r->ttl * 1000000000ull, 1000000000ull);
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
