/* ref_forward.c - float64 reference transformer (see ref_forward.h).
 * Deliberately simple and slow: every matrix row is decoded each time it is
 * used, attention recomputes over the whole prefix. */
#include "ref_forward.h"
#include "base/err.h"
#include "base/mem.h"
#include "tensor/repack.h"
#include "tensor/types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* y[o] = sum_i W[o,i] x[i] for W of ne = {n_in, n_out}. */
static void matvec(const tensor *W, const double *x, double *y, float *rowbuf)
{
    for (int64_t o = 0; o < W->ne[1]; o++) {
        tensor_row_to_float(W->type, W->data, W->row_bytes, o, rowbuf, W->ne[0]);
        double s = 0;
        for (int64_t i = 0; i < W->ne[0]; i++)
            s += (double)rowbuf[i] * x[i];
        y[o] = s;
    }
}

static void rmsnorm(double *out, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double k = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * k * w[i];
}

/* YaRN (deepseek2): theta = (1 - ramp_i) * theta_i / factor + ramp_i * theta_i
 * with the ramp between the dims cd(32) and cd(1) of the original context. */
static double yarn_ramp(const model_hparams *hp, int i)
{
    const double d = hp->rope_dim, b = hp->rope_base, n0 = hp->yarn_orig_ctx;
    double lo = floor(d * log(n0 / (2 * M_PI * 32)) / (2 * log(b)));
    double hi = ceil(d * log(n0 / (2 * M_PI)) / (2 * log(b)));
    lo = fmax(0, lo);
    hi = fmin(d - 1, hi);
    return 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
}

static void rope(double *v, int pos, const model_hparams *hp, const float *freqs)
{
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = pos * (double)hp->rope_freq_scale * pow(hp->rope_base, -2.0 * i / hp->rope_dim);
        if (freqs)
            theta /= freqs[i];
        if (hp->yarn_factor > 0) {
            double te = pos * pow(hp->rope_base, -2.0 * i / hp->rope_dim), r = yarn_ramp(hp, i);
            theta = te / hp->yarn_factor * (1 - r) + te * r;
        }
        int a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
        double x0 = v[a], x1 = v[b], c = cos(theta) * hp->rope_attn_factor,
               s = sin(theta) * hp->rope_attn_factor;
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

/* y[o] = sum_i W(o, i, j) x[i] for slice j of a 3-D tensor. */
static void matvec_slice(const tensor *W, int j, const double *x, double *y, float *rowbuf)
{
    tensor s = tensor_slice2(W, j);
    matvec(&s, x, y, rowbuf);
}

/* Latent attention in the expanded form (the stage uses the absorbed one):
 * every position's keys and values are decompressed per head. */
static void mla_attention(const model *m, const layer_weights *L, const double *xs, int n,
                          double *out, float *rowbuf)
{
    const model_hparams *hp = &m->hp;
    const int E = hp->n_embd, H = hp->n_head, D = hp->head_dim, Dr = hp->rope_dim, Dn = D - Dr;
    const int Dv = hp->head_dim_v, R = hp->kv_lora_rank, Rq = hp->q_lora_rank;
    double *h = calloc((size_t)E, sizeof *h), *cq = calloc((size_t)Rq + 1, sizeof *cq);
    double *Q = calloc((size_t)n * H * D, sizeof *Q), *a = calloc((size_t)R + Dr, sizeof *a);
    double *Kn = calloc((size_t)n * H * Dn, sizeof *Kn), *Kpe = calloc((size_t)n * Dr, sizeof *Kpe);
    double *Vv = calloc((size_t)n * H * Dv, sizeof *Vv), *sc = calloc((size_t)n, sizeof *sc);
    double *o = calloc((size_t)H * Dv, sizeof *o);
    for (int r = 0; r < n; r++) {
        rmsnorm(h, xs + (size_t)r * E, L->attn_norm.data, E, hp->rms_eps);
        double *q = Q + (size_t)r * H * D;
        if (L->wq_a.data) {
            matvec(&L->wq_a, h, cq, rowbuf);
            rmsnorm(cq, cq, L->q_a_norm.data, Rq, hp->rms_eps);
            matvec(&L->wq_b, cq, q, rowbuf);
        } else {
            matvec(&L->wq, h, q, rowbuf);
        }
        for (int j = 0; j < H; j++)
            rope(q + j * D + Dn, r, hp, NULL);
        matvec(&L->wkv_a, h, a, rowbuf);
        rmsnorm(a, a, L->kv_a_norm.data, R, hp->rms_eps);
        rope(a + R, r, hp, NULL);
        memcpy(Kpe + (size_t)r * Dr, a + R, sizeof(double) * Dr);
        for (int j = 0; j < H; j++) {
            /* k_nope_j[d] = sum_r Kb(d, r, j) c[r]: attn_k_b's ne0 is its output */
            tensor kb = tensor_slice2(&L->wk_b, j);
            for (int d = 0; d < Dn; d++)
                Kn[((size_t)r * H + j) * Dn + d] = 0;
            for (int rr = 0; rr < R; rr++) {
                tensor_row_to_float(kb.type, kb.data, kb.row_bytes, rr, rowbuf, Dn);
                for (int d = 0; d < Dn; d++)
                    Kn[((size_t)r * H + j) * Dn + d] += rowbuf[d] * a[rr];
            }
            matvec_slice(&L->wv_b, j, a, Vv + ((size_t)r * H + j) * Dv, rowbuf);
        }
    }
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < H; j++) {
            const double *q = Q + (size_t)r * H * D + j * D;
            double max = -INFINITY, sum = 0;
            for (int t = 0; t <= r; t++) {
                double d = 0;
                for (int i = 0; i < Dn; i++)
                    d += q[i] * Kn[((size_t)t * H + j) * Dn + i];
                for (int i = 0; i < Dr; i++)
                    d += q[Dn + i] * Kpe[(size_t)t * Dr + i];
                sc[t] = d * hp->kq_scale;
                max = fmax(max, sc[t]);
            }
            for (int t = 0; t <= r; t++)
                sum += (sc[t] = exp(sc[t] - max));
            for (int i = 0; i < Dv; i++) {
                double acc = 0;
                for (int t = 0; t <= r; t++)
                    acc += sc[t] / sum * Vv[((size_t)t * H + j) * Dv + i];
                o[j * Dv + i] = acc;
            }
        }
        matvec(&L->wo, o, out + (size_t)r * E, rowbuf);
    }
    free(h); free(cq); free(Q); free(a); free(Kn); free(Kpe); free(Vv); free(sc); free(o);
}

/* Expert choice: softmax or sigmoid gates; the bias only chooses; groups
 * scored by their two best; the top K of the allowed; weights normalised
 * and scaled.  Returns the number chosen. */
static int choose_experts(const model_hparams *hp, const layer_weights *L, double *p, int *chosen,
                          double *w)
{
    const int X = hp->n_expert, K = hp->n_expert_used, G = hp->n_expert_group;
    double s[512];
    if (hp->expert_gating == GATING_SIGMOID) {
        for (int e = 0; e < X; e++) p[e] = 1 / (1 + exp(-p[e]));
    } else {
        double max = -INFINITY, sum = 0;
        for (int e = 0; e < X; e++) max = fmax(max, p[e]);
        for (int e = 0; e < X; e++) sum += (p[e] = exp(p[e] - max));
        for (int e = 0; e < X; e++) p[e] /= sum;
    }
    for (int e = 0; e < X; e++)
        s[e] = p[e] + (L->exp_probs_b.data ? ((const float *)L->exp_probs_b.data)[e] : 0);
    if (G > 1) {
        const int per = X / G;
        double gs[64];
        int used[64] = { 0 };
        for (int g = 0; g < G; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (s[e] > a) { b = a; a = s[e]; } else if (s[e] > b) b = s[e];
            }
            gs[g] = a + b;
        }
        for (int k = 0; k < hp->n_expert_group_used; k++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!used[g] && (best < 0 || gs[g] > gs[best])) best = g;
            used[best] = 1;
        }
        for (int g = 0; g < G; g++)
            if (!used[g])
                for (int e = g * per; e < (g + 1) * per; e++) s[e] = -INFINITY;
    }
    double wsum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= chosen[j] == e;
            if (!taken && (best < 0 || s[e] > s[best])) best = e;
        }
        chosen[k] = best;
        wsum += p[best];
    }
    for (int k = 0; k < K; k++) {
        w[k] = p[chosen[k]];
        if (hp->expert_weights_norm) w[k] /= fmax(wsum, 6.103515625e-5);
        w[k] *= hp->expert_weights_scale;
    }
    return K;
}

static void ffn(const tensor *g, const tensor *u, const tensor *d, const double *h,
                double *out, double *a, double *b, float *rowbuf)
{
    matvec(g, h, a, rowbuf);
    matvec(u, h, b, rowbuf);
    for (int64_t i = 0; i < g->ne[1]; i++)
        a[i] = a[i] / (1.0 + exp(-a[i])) * b[i];
    matvec(d, a, out, rowbuf);
}

/* Logits, or (hidden != NULL) the states after the output norm instead. */
static int ref_run(const model *m, const int32_t *tokens, int n, double *logits, double *hidden)
{
    const model_hparams *hp = &m->hp;
    const int E = hp->n_embd, H = hp->n_head, Hk = hp->n_head_kv, D = hp->head_dim,
              Dv = hp->head_dim_v, V = hp->n_vocab;
    int F = hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp;
    if (hp->n_expert_shared * hp->n_ff_exp > F)
        F = hp->n_expert_shared * hp->n_ff_exp;
    const int widest = hp->kv_lora_rank + hp->q_lora_rank + hp->head_dim * hp->n_head;
    const int big = E > V ? E : V;
    double *x = calloc((size_t)n * E, sizeof *x), *h = calloc((size_t)E, sizeof *h);
    double *K = calloc((size_t)n * Hk * D, sizeof *K), *Vv = calloc((size_t)n * Hk * Dv, sizeof *Vv);
    double *Q = calloc((size_t)n * H * D, sizeof *Q), *o = calloc((size_t)H * Dv, sizeof *o);
    double *t = calloc((size_t)big + F, sizeof *t), *a = calloc((size_t)F, sizeof *a);
    double *b = calloc((size_t)F, sizeof *b), *sc = calloc((size_t)n, sizeof *sc);
    double *p = calloc((size_t)hp->n_expert + 1, sizeof *p);
    float *rowbuf = calloc((size_t)big + F + H * Dv + widest, sizeof *rowbuf);
    int rc = RC_ENOMEM;
    if (!x || !h || !K || !Vv || !Q || !o || !t || !a || !b || !sc || !p || !rowbuf)
        goto done;
    const tensor_traits *et = tensor_type_traits_ref(m->tok_embd.type);
    for (int r = 0; r < n; r++) {
        et->to_float((const uint8_t *)m->tok_embd.data + (size_t)tokens[r] * m->tok_embd.row_bytes, rowbuf, E);
        for (int i = 0; i < E; i++)
            x[(size_t)r * E + i] = rowbuf[i];
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        if (hp->kv_lora_rank > 0) {
            double *att = calloc((size_t)n * E, sizeof *att);
            if (!att)
                goto done;
            mla_attention(m, L, x, n, att, rowbuf);
            for (size_t i = 0; i < (size_t)n * E; i++)
                x[i] += att[i];
            free(att);
        }
        for (int r = 0; r < n && hp->kv_lora_rank == 0; r++) {
            rmsnorm(h, x + (size_t)r * E, L->attn_norm.data, E, hp->rms_eps);
            double *q = Q + (size_t)r * H * D, *k = K + (size_t)r * Hk * D, *v = Vv + (size_t)r * Hk * Dv;
            matvec(&L->wq, h, q, rowbuf);
            matvec(&L->wk, h, k, rowbuf);
            matvec(&L->wv, h, v, rowbuf);
            if (L->bq.data) for (int i = 0; i < H * D; i++) q[i] += ((const float *)L->bq.data)[i];
            if (L->bk.data) for (int i = 0; i < Hk * D; i++) k[i] += ((const float *)L->bk.data)[i];
            if (L->bv.data) for (int i = 0; i < Hk * Dv; i++) v[i] += ((const float *)L->bv.data)[i];
            for (int hh = 0; hh < H; hh++) {
                if (L->q_norm.data) rmsnorm(q + hh * D, q + hh * D, L->q_norm.data, D, hp->rms_eps);
                rope(q + hh * D, r, hp, m->rope_freqs.data);
            }
            for (int hh = 0; hh < Hk; hh++) {
                if (L->k_norm.data) rmsnorm(k + hh * D, k + hh * D, L->k_norm.data, D, hp->rms_eps);
                rope(k + hh * D, r, hp, m->rope_freqs.data);
            }
        }
        for (int r = 0; r < n; r++) {
            for (int hh = 0; hh < H && hp->kv_lora_rank == 0; hh++) {
                int kh = hh / (H / Hk);
                double max = -INFINITY, sum = 0;
                for (int s = 0; s <= r; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++)
                        d += Q[(size_t)r * H * D + hh * D + i] * K[(size_t)s * Hk * D + kh * D + i];
                    sc[s] = d / sqrt((double)D);
                    if (sc[s] > max) max = sc[s];
                }
                for (int s = 0; s <= r; s++)
                    sum += (sc[s] = exp(sc[s] - max));
                for (int i = 0; i < Dv; i++) {
                    double acc = 0;
                    for (int s = 0; s <= r; s++)
                        acc += sc[s] / sum * Vv[(size_t)s * Hk * Dv + kh * Dv + i];
                    o[hh * Dv + i] = acc;
                }
            }
            double *xr = x + (size_t)r * E;
            if (hp->kv_lora_rank == 0) {
                matvec(&L->wo, o, t, rowbuf);
                for (int i = 0; i < E; i++)
                    xr[i] += t[i];
            }
            rmsnorm(h, xr, L->ffn_norm.data, E, hp->rms_eps);
            if (!L->gate_inp.data) {
                ffn(&L->w_gate, &L->w_up, &L->w_down, h, t, a, b, rowbuf);
                for (int i = 0; i < E; i++)
                    xr[i] += t[i];
                continue;
            }
            matvec(&L->gate_inp, h, p, rowbuf);
            int chosen[64];
            double w[64];
            int n_used = choose_experts(hp, L, p, chosen, w);
            for (int k = 0; k < n_used; k++) {
                int e = chosen[k];
                tensor g = tensor_slice2(&L->gate_exps, e), u = tensor_slice2(&L->up_exps, e),
                       d = tensor_slice2(&L->down_exps, e);
                ffn(&g, &u, &d, h, t, a, b, rowbuf);
                for (int i = 0; i < E; i++)
                    xr[i] += w[k] * t[i];
            }
            if (L->gate_shexp.data) {
                ffn(&L->gate_shexp, &L->up_shexp, &L->down_shexp, h, t, a, b, rowbuf);
                for (int i = 0; i < E; i++)
                    xr[i] += t[i];
            }
        }
    }
    for (int r = 0; r < n; r++) {
        rmsnorm(h, x + (size_t)r * E, m->output_norm.data, E, hp->rms_eps);
        if (hidden)
            memcpy(hidden + (size_t)r * E, h, (size_t)E * sizeof *h);
        else
            matvec(&m->output, h, logits + (size_t)r * V, rowbuf);
    }
    rc = 0;
done:
    free(x); free(h); free(K); free(Vv); free(Q); free(o); free(t); free(a); free(b);
    free(sc); free(p); free(rowbuf);
    return rc;
}

int ref_forward(const model *m, const int32_t *tokens, int n, double *logits)
{
    return ref_run(m, tokens, n, logits, NULL);
}

int ref_hidden(const model *m, const int32_t *tokens, int n, double *hidden)
{
    return ref_run(m, tokens, n, NULL, hidden);
}
