/* test_cost.c - the cost of a token: the arithmetic (cost.h), tokens/s
 * over a window, the RAPL meter on a fake powercap folder (wraps,
 * subzones, unreadable counters), and the figures a node serves in
 * /v1/cluster and /metrics with --watts and a price. */
#include "test.h"
#include "http_util.h"
#include "model_util.h"
#include "api/api.h"
#include "api/cost.h"
#include "base/err.h"
#include "base/power.h"
#include "tensor/types.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S 1000000000ull

TEST(cost_arithmetic)
{
    /* 3 years of a 1000-unit machine: 1000 / (3 * 8766) per hour */
    CHECK_NEAR(cost_hw_per_hour(1000, 3), 1000.0 / 26298.0, 1e-12);
    CHECK_NEAR(cost_hw_per_hour(1000, 0), 0, 0);
    CHECK_NEAR(cost_hw_per_hour(-5, 3), 0, 0);
    /* two nodes, 60 W and 40 W, 0.30 per kWh, one amortised at 0.05/h; 10 tokens/s:
     * 100 W / 10 tok/s = 10 J/token = 10000 J / 1k tokens = 2.7778 Wh;
     * per hour 0.1 kW * 0.3 + 0.05 = 0.08, for 36000 tokens: 2.2222 per million */
    cost_node n[2] = { { 60, -1, 0.05 }, { 40, -1, 0 } };
    cost_figures f = cost_compute(n, 2, 10, 0.30);
    CHECK_NEAR(f.watts, 100, 1e-12);
    CHECK_NEAR(f.wh_per_1k, 10000.0 / 3600, 1e-9);
    CHECK_NEAR(f.cost_per_mtok, 0.08 / 36000 * 1e6, 1e-9);
    /* a node's own price wins over the asking node's */
    n[1].price_kwh = 0.60;
    f = cost_compute(n, 2, 10, 0.30);
    CHECK_NEAR(f.cost_per_mtok, (0.06 * 0.3 + 0.04 * 0.6 + 0.05) / 36000 * 1e6, 1e-9);
    /* no price anywhere: energy yes, money no */
    cost_node q[1] = { { 50, -1, 0 } };
    f = cost_compute(q, 1, 5, -1);
    CHECK_NEAR(f.wh_per_1k, 50.0 / 5 * 1000 / 3600, 1e-9);
    CHECK(f.cost_per_mtok < 0);
    /* a price of 0 (free power) with amortisation: the hardware alone */
    cost_node h[1] = { { 50, 0, 0.36 } };
    f = cost_compute(h, 1, 10, -1);
    CHECK_NEAR(f.cost_per_mtok, 0.36 / 36000 * 1e6, 1e-9);
    /* one node of unknown power: nothing known; no tokens: no per-token figure */
    cost_node u[2] = { { 50, 0.3, 0 }, { -1, 0.3, 0 } };
    f = cost_compute(u, 2, 10, 0.3);
    CHECK(f.watts < 0 && f.wh_per_1k < 0 && f.cost_per_mtok < 0);
    f = cost_compute(q, 1, 0, 0.3);
    CHECK_NEAR(f.watts, 50, 0);
    CHECK(f.wh_per_1k < 0 && f.cost_per_mtok < 0);
    f = cost_compute(q, 0, 10, 0.3);
    CHECK(f.watts < 0);
}

TEST(cost_rate_window)
{
    cost_rate r;
    memset(&r, 0, sizeof r);
    double in, out;
    CHECK(!cost_rate_get(&r, 60, &in, &out));
    cost_rate_add(&r, 1 * S, 100, 10);
    CHECK(!cost_rate_get(&r, 60, &in, &out));
    /* 20 tokens out and 50 in over 2 s */
    cost_rate_add(&r, 2 * S, 130, 20);
    cost_rate_add(&r, 3 * S, 150, 30);
    CHECK(cost_rate_get(&r, 60, &in, &out));
    CHECK_NEAR(in, 25, 1e-9);
    CHECK_NEAR(out, 10, 1e-9);
    /* the window keeps only the last 60 s: 100 samples later, a steady 7/s out */
    for (int k = 4; k < 104; k++)
        cost_rate_add(&r, (uint64_t)k * S, 150, 30 + (uint64_t)(k - 3) * 7);
    CHECK(cost_rate_get(&r, 60, &in, &out));
    CHECK_NEAR(in, 0, 0);
    CHECK_NEAR(out, 7, 1e-9);
    /* idle: no tokens in the window, 0/s */
    uint64_t last = 30 + 100 * 7;
    for (int k = 104; k < 170; k++)
        cost_rate_add(&r, (uint64_t)k * S, 150, last);
    CHECK(cost_rate_get(&r, 60, &in, &out));
    CHECK_NEAR(out, 0, 0);
    /* counters that restart (a rebuilt instance): no negative rate */
    cost_rate_add(&r, 170 * S, 0, 0);
    CHECK(cost_rate_get(&r, 60, &in, &out));
    CHECK(in == 0 && out == 0);
}

static void write_num(const char *dir, const char *zone, const char *file, unsigned long long v)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, zone);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", dir, zone, file);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fprintf(f, "%llu\n", v);
    fclose(f);
}

TEST(cost_rapl_meter)
{
    char root[600];
    snprintf(root, sizeof root, "%s/powercap", test_tmpdir());
    power_meter m;
    /* no folder (macOS, a VM): nothing measured */
    power_meter_init(&m, root);
    CHECK(power_meter_sample(&m, 1 * S) < 0);
    CHECK(power_meter_sample(&m, 2 * S) < 0);
    mkdir(root, 0755);
    write_num(root, "intel-rapl:0", "energy_uj", 1000000);
    write_num(root, "intel-rapl:0", "max_energy_range_uj", 262143328850ull);
    /* counters that appear are looked for only POWER_RETRY_S after the
     * failed reading: until then nothing is read (else this would be the
     * first reading, and the next one a measure) */
    CHECK(power_meter_sample(&m, 30 * S) < 0);
    CHECK(power_meter_sample(&m, 31 * S) < 0);
    CHECK(power_meter_sample(&m, (1 + POWER_RETRY_S) * S) < 0);   /* the first reading */
    write_num(root, "intel-rapl:0", "energy_uj", 11000000);
    CHECK_NEAR(power_meter_sample(&m, (3 + POWER_RETRY_S) * S), 5, 1e-9);
    /* two packages and a subzone (part of package 0: not added) */
    write_num(root, "intel-rapl:0", "energy_uj", 1000000);
    write_num(root, "intel-rapl:0", "max_energy_range_uj", 262143328850ull);
    write_num(root, "intel-rapl:1", "energy_uj", 5000000);
    write_num(root, "intel-rapl:1", "max_energy_range_uj", 262143328850ull);
    write_num(root, "intel-rapl:0:0", "energy_uj", 999999999);
    power_meter_init(&m, root);
    CHECK(power_meter_sample(&m, 10 * S) < 0);          /* the first reading: no interval */
    /* 2 s later, 30 J + 50 J: 40 W */
    write_num(root, "intel-rapl:0", "energy_uj", 31000000);
    write_num(root, "intel-rapl:1", "energy_uj", 55000000);
    write_num(root, "intel-rapl:0:0", "energy_uj", 5);
    CHECK_NEAR(power_meter_sample(&m, 12 * S), 40, 1e-9);
    /* no time passed: the last measure again */
    CHECK_NEAR(power_meter_sample(&m, 12 * S), 40, 1e-9);
    /* package 1 wraps: 55 J -> the end of its range, then 5 J past 0 */
    write_num(root, "intel-rapl:0", "energy_uj", 41000000);
    write_num(root, "intel-rapl:1", "max_energy_range_uj", 60000000);
    write_num(root, "intel-rapl:0", "max_energy_range_uj", 0);
    write_num(root, "intel-rapl:1", "energy_uj", 5000000);
    /* before: 86 J of 60 J + 262143 J ranges; now 46 J: wrapped, 10 + 10 J... */
    double w = power_meter_sample(&m, 13 * S);
    CHECK(w >= 0 && w < 1e6);                            /* counted across, never negative */
    /* counters unreadable (a kernel that restricts energy_uj): unknown again */
    char path[700];
    snprintf(path, sizeof path, "%s/intel-rapl:0/energy_uj", root);
    unlink(path);
    snprintf(path, sizeof path, "%s/intel-rapl:1/energy_uj", root);
    unlink(path);
    CHECK(power_meter_sample(&m, 14 * S) < 0);
}

static void *serve(void *arg)
{
    api_server_run(arg);
    return NULL;
}

TEST(cost_served)
{
    static const char *paths[1];
    paths[0] = test_make_model("tiny", TT_Q8_0, NULL);
    api_config cfg;
    api_config_default(&cfg);
    cfg.port = 0;
    cfg.model_paths = paths;
    cfg.n_model_paths = 1;
    cfg.models_dir = test_tmpdir();
    cfg.ro_dirs = "";
    cfg.threads = 1;
    cfg.ctx_size = 256;
    cfg.watts = 80;
    cfg.price_kwh = 0.25;
    cfg.hw_price = 2000;
    cfg.hw_years = 4;
    cfg.cloud_price = 0.5;
    api_server *s;
    pthread_t th;
    CHECK_OK(api_server_new(&cfg, &s));
    CHECK(pthread_create(&th, NULL, serve, s) == 0);
    int port = api_server_port(s);
    static char buf[1 << 17];
    for (int i = 0; i < 1000 && http_request(port, "GET", "/health", NULL, NULL, buf, sizeof buf) != 200; i++)
        usleep(10000);
    /* tokens, then the figures once the once-a-second sampling has seen them */
    CHECK_INT(http_request(port, "POST", "/v1/completions", NULL,
                           "{\"model\":\"tiny-Q8_0\",\"prompt\":\"x\",\"max_tokens\":40,"
                           "\"ignore_eos\":true}", buf, sizeof buf), ==, 200);
    json_t *m = NULL;
    double tps = 0;
    for (int i = 0; i < 300 && !(tps > 0); i++) {
        usleep(50000);
        CHECK_INT(http_request(port, "GET", "/v1/cluster", NULL, NULL, buf, sizeof buf), ==, 200);
        json_t *o = json_loads(strstr(buf, "\r\n\r\n") + 4, 0, NULL);
        CHECK(o);
        json_decref(m);
        m = json_deep_copy(o);
        json_decref(o);
        tps = json_number_value(json_object_get(json_object_get(json_array_get(
                  json_object_get(m, "models"), 0), "cost"), "tokens_per_s"));
    }
    if (!(tps > 0))
        FAIL("no tokens/s within 15 s: %.500s", buf);
    json_t *cost = json_object_get(json_array_get(json_object_get(m, "models"), 0), "cost");
    json_t *basis = json_object_get(m, "cost");
    CHECK_NEAR(json_number_value(json_object_get(cost, "watts")), 80, 0);
    CHECK_NEAR(json_number_value(json_object_get(basis, "cloud_per_mtok")), 0.5, 0);
    CHECK_STR(json_string_value(json_object_get(json_object_get(basis, "power"), "source")), "configured");
    double wh = json_number_value(json_object_get(cost, "wh_per_1k_tokens"));
    double usd = json_number_value(json_object_get(cost, "cost_per_mtok"));
    CHECK_NEAR(wh, 80 / tps * 1000 / 3600, 1e-6 * wh);
    CHECK_NEAR(usd, (0.08 * 0.25 + 2000 / (4 * 8766.0)) / (tps * 3600) * 1e6, 1e-6 * usd);
    json_decref(m);
    /* the same gauges in /metrics */
    CHECK_INT(http_request(port, "GET", "/metrics", NULL, NULL, buf, sizeof buf), ==, 200);
    CHECK(strstr(buf, "racimo_node_power_watts 80.000\n"));
    CHECK(strstr(buf, "racimo_cloud_cost_per_million_tokens 0.500000\n"));
    CHECK(strstr(buf, "racimo_model_power_watts{model=\"tiny-Q8_0\"} 80.000000\n"));
    CHECK(strstr(buf, "racimo_model_energy_wh_per_1k_tokens{model=\"tiny-Q8_0\"} "));
    CHECK(strstr(buf, "racimo_model_cost_per_million_tokens{model=\"tiny-Q8_0\"} "));
    CHECK(strstr(buf, "# TYPE racimo_model_tokens_per_second gauge\n"));
    api_server_stop(s);
    pthread_join(th, NULL);
    api_server_free(s);
}
