/* test_cluster_query.c - GET /v1/cluster's nodes/state/offset/limit/summary
 * parameters (src/api/cluster_query.c) on a view of 25 nodes. */
#include "test.h"

#include "api/cluster_query.h"
#include "base/err.h"

#include <jansson.h>

static json_t *view(void)
{
    json_t *nodes = json_array(), *links = json_array();
    for (int i = 24; i >= 0; i--) {             /* out of order: pages come in id order */
        char id[33], name[16];
        snprintf(id, sizeof id, "%02x%030d", i, 0);
        snprintf(name, sizeof name, "node%d", i);
        json_t *serving = json_array();
        if (i % 5 == 0) json_array_append_new(serving, json_string("tiny"));
        json_array_append_new(nodes, json_pack(
            "{s:s, s:s, s:s, s:{s:i, s:I, s:I}, s:o, s:{s:i}, s:{s:i}}", "id", id, "name", name,
            "state", i % 4 == 3 ? "down" : "up", "hardware", "cores", 4,
            "mem_total", (json_int_t)1000, "mem_free", (json_int_t)600, "serving", serving,
            "serving_slots", "tiny", 4, "serving_free", "tiny", i % 10 == 0 ? 1 : 3));
        json_array_append_new(links, json_pack("{s:s, s:s, s:f}", "from", id, "to", id, "rtt_ms", 0.3));
    }
    return json_pack("{s:o, s:o, s:s}", "nodes", nodes, "links", links, "leader", "x");
}

static const char *id_at(json_t *b, size_t i)
{
    return json_string_value(json_object_get(json_array_get(json_object_get(b, "nodes"), i), "id"));
}

TEST(cluster_query_paging)
{
    json_t *b = view();
    CHECK_OK(cluster_query_apply(b, NULL));
    CHECK_INT(json_array_size(json_object_get(b, "nodes")), ==, 25);
    CHECK(!json_object_get(b, "nodes_total"));        /* unchanged without a query */

    CHECK_OK(cluster_query_apply(b, "offset=10&limit=10"));
    CHECK_INT(json_array_size(json_object_get(b, "nodes")), ==, 10);
    CHECK_INT(json_array_size(json_object_get(b, "links")), ==, 10);
    CHECK_INT(json_integer_value(json_object_get(b, "nodes_total")), ==, 25);
    CHECK_INT(json_integer_value(json_object_get(b, "next_offset")), ==, 20);
    CHECK(!strncmp(id_at(b, 0), "0a", 2));
    CHECK(!strncmp(id_at(b, 9), "13", 2));
    json_decref(b);

    b = view();
    CHECK_OK(cluster_query_apply(b, "offset=20&limit=10"));
    CHECK_INT(json_array_size(json_object_get(b, "nodes")), ==, 5);
    CHECK(json_is_null(json_object_get(b, "next_offset")));
    json_decref(b);

    b = view();
    CHECK_OK(cluster_query_apply(b, "state=down"));
    CHECK_INT(json_integer_value(json_object_get(b, "nodes_total")), ==, 6);   /* 3,7,...,23 */
    json_decref(b);

    b = view();
    char q[128];
    snprintf(q, sizeof q, "nodes=node7,%02x%06d", 12, 0);     /* a name and an 8-digit prefix */
    CHECK_OK(cluster_query_apply(b, q));
    CHECK_INT(json_array_size(json_object_get(b, "nodes")), ==, 2);
    CHECK_STR(json_string_value(json_object_get(json_array_get(json_object_get(b, "nodes"), 0), "name")), "node7");
    json_decref(b);

    b = view();
    CHECK_OK(cluster_query_apply(b, "nodes=0c00"));              /* prefix too short: nothing */
    CHECK_INT(json_integer_value(json_object_get(b, "nodes_total")), ==, 0);
    json_decref(b);
}

TEST(cluster_query_summary)
{
    json_t *b = view();
    CHECK_OK(cluster_query_apply(b, "summary=1"));
    CHECK(!json_object_get(b, "nodes"));
    CHECK(!json_object_get(b, "links"));
    json_t *s = json_object_get(b, "summary");
    CHECK_INT(json_integer_value(json_object_get(json_object_get(s, "states"), "up")), ==, 19);
    CHECK_INT(json_integer_value(json_object_get(json_object_get(s, "states"), "down")), ==, 6);
    CHECK_INT(json_integer_value(json_object_get(s, "cores_up")), ==, 19 * 4);
    /* tiny on 0,5,10,15,20; 15 is down (3 mod 4) and not counted */
    json_t *t = json_object_get(json_object_get(s, "serving"), "tiny");
    CHECK_INT(json_integer_value(json_object_get(t, "nodes")), ==, 4);
    CHECK_INT(json_integer_value(json_object_get(t, "slots")), ==, 16);
    CHECK_INT(json_integer_value(json_object_get(t, "free")), ==, 1 + 3 + 1 + 1);
    json_decref(b);
}

TEST(cluster_query_bad_parameters)
{
    const char *bad[] = { "limit=0", "limit=-1", "limit=abc", "limit=10001", "offset=x",
                          "state=sideways", "summary=maybe", "colour=blue" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = view();
        CHECK_INT(cluster_query_apply(b, bad[i]), ==, RC_EINVAL);
        CHECK(strlen(rc_errmsg()) > 0);
        CHECK_INT(json_array_size(json_object_get(b, "nodes")), ==, 25);   /* untouched */
        json_decref(b);
    }
}
