/* ref_forward.c - float64 reference transformer (see ref_forward.h).
 * Deliberately simple and slow: every matrix row is decoded each time it is
 * used, attention recomputes over the whole prefix. */
#include "ref_forward.h"
#include "base/err.h"
#include "base/mem.h"
#include "tensor/types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* y[o] = sum_i W[o,i] x[i] for W of ne = {n_in, n_out}. */
static void matvec(const tensor *W, const double *x, double *y, float *rowbuf)
{
    const tensor_traits *tt = tensor_type_traits_ref(W->type);
    for (int64_t o = 0; o < W->ne[1]; o++) {
        tt->to_float((const uint8_t *)W->data + (size_t)o * W->row_bytes, rowbuf, W->ne[0]);
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

static void rope(double *v, int pos, const model_hparams *hp, const float *freqs)
{
    int half = hp->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        double theta = pos * (double)hp->rope_freq_scale * pow(hp->rope_base, -2.0 * i / hp->rope_dim);
        if (freqs)
            theta /= freqs[i];
        int a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * cos(theta) - x1 * sin(theta);
        v[b] = x0 * sin(theta) + x1 * cos(theta);
    }
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

int ref_forward(const model *m, const int32_t *tokens, int n, double *logits)
{
    const model_hparams *hp = &m->hp;
    const int E = hp->n_embd, H = hp->n_head, Hk = hp->n_head_kv, D = hp->head_dim,
              Dv = hp->head_dim_v, V = hp->n_vocab;
    const int F = hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp;
    const int big = E > V ? E : V;
    double *x = calloc((size_t)n * E, sizeof *x), *h = calloc((size_t)E, sizeof *h);
    double *K = calloc((size_t)n * Hk * D, sizeof *K), *Vv = calloc((size_t)n * Hk * Dv, sizeof *Vv);
    double *Q = calloc((size_t)n * H * D, sizeof *Q), *o = calloc((size_t)H * Dv, sizeof *o);
    double *t = calloc((size_t)big + F, sizeof *t), *a = calloc((size_t)F, sizeof *a);
    double *b = calloc((size_t)F, sizeof *b), *sc = calloc((size_t)n, sizeof *sc);
    double *p = calloc((size_t)hp->n_expert + 1, sizeof *p);
    float *rowbuf = calloc((size_t)big + F + H * Dv, sizeof *rowbuf);
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
        for (int r = 0; r < n; r++) {
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
            for (int hh = 0; hh < H; hh++) {
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
            matvec(&L->wo, o, t, rowbuf);
            double *xr = x + (size_t)r * E;
            for (int i = 0; i < E; i++)
                xr[i] += t[i];
            rmsnorm(h, xr, L->ffn_norm.data, E, hp->rms_eps);
            if (hp->n_expert == 0) {
                ffn(&L->w_gate, &L->w_up, &L->w_down, h, t, a, b, rowbuf);
                for (int i = 0; i < E; i++)
                    xr[i] += t[i];
                continue;
            }
            matvec(&L->gate_inp, h, p, rowbuf);
            double max = -INFINITY, sum = 0;
            for (int e = 0; e < hp->n_expert; e++) if (p[e] > max) max = p[e];
            for (int e = 0; e < hp->n_expert; e++) sum += (p[e] = exp(p[e] - max));
            for (int e = 0; e < hp->n_expert; e++) p[e] /= sum;
            int chosen[64];
            double wsum = 0;
            for (int k = 0; k < hp->n_expert_used; k++) {
                int best = -1;
                for (int e = 0; e < hp->n_expert; e++) {
                    int taken = 0;
                    for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                    if (!taken && (best < 0 || p[e] > p[best])) best = e;
                }
                chosen[k] = best;
                wsum += p[best];
            }
            for (int k = 0; k < hp->n_expert_used; k++) {
                int e = chosen[k];
                tensor g = tensor_slice2(&L->gate_exps, e), u = tensor_slice2(&L->up_exps, e),
                       d = tensor_slice2(&L->down_exps, e);
                ffn(&g, &u, &d, h, t, a, b, rowbuf);
                double w = hp->expert_weights_norm ? p[e] / wsum : p[e];
                for (int i = 0; i < E; i++)
                    xr[i] += w * t[i];
            }
        }
    }
    for (int r = 0; r < n; r++) {
        rmsnorm(h, x + (size_t)r * E, m->output_norm.data, E, hp->rms_eps);
        matvec(&m->output, h, logits + (size_t)r * V, rowbuf);
    }
    rc = 0;
done:
    free(x); free(h); free(K); free(Vv); free(Q); free(o); free(t); free(a); free(b);
    free(sc); free(p); free(rowbuf);
    return rc;
}
