/*
 * test_gemma_emulated.cpp: the CUDA kernels Gemma 3's forward pass uses,
 * run on the CPU through the execution model emulation of cuda_emu.h, against
 * the CPU backend itself (backend_cpu_init on a small Gemma-shaped model whose
 * weights are only the norm vectors the ops read). No GPU and no CUDA toolkit
 * needed.
 *
 * Model: D 48, H 4, Hkv 2, Dh 16, F 40, rope_dim 16 in NEOX pairs, RoPE base
 * 1e6 (global layers) and 1e4 (local layers), 3 layers of which 0 and 1 are
 * local (swa_period 3) with a window of 6, attn_scale 0.41 (not 1/sqrt(Dh)).
 * KV geometry: 4 sinks, window 13, chunk 8, two slots, local rings of 6 + 8
 * cells; f16 and f32 storage.
 *
 * Four steps, each built as forward.c's build_batch builds it (cells and
 * views in the global and the local rings) and as cuda_begin_step packs it
 * (tokens, prefill tiles, decode tokens, RoPE tables in double with the
 * layer's base): A (sinks:4 from position 0) and B (window-only from
 * 1e9+7) prefill 8 + 8, then 8 + 6, then A 7, then A decodes one token
 * (position 23: 24 positions, its local ring of 14 cells wrapped) while B
 * prefills 6 (positions past the local window, the ring wrapped inside the
 * run). Every layer of every step: random q, k, v; the CPU backend's rope,
 * kv_store, attention against the emulated rope_kernel, kv_store_kernel and
 * attention kernels (prefill tiles, split-K + merge) launched as
 * backend_cuda.cu's issue() launches them, each side attending over its own
 * KV storage.
 *
 * Checks, each printed as "emu-vs-cpu NAME REL" (REL = max |emu - cpu| over
 * max |cpu|, infinite on NaN):
 * - KV.stepN.layerL.rope (q, qc and k): tolerance 1e-6 (same float products);
 * - KV.stepN.layerL.attention: tolerance 1e-4 (summation order, as
 *   test_attention_emulated);
 * - per_head_rmsnorm (rows T*H of Dh with a weight of Dh), geglu, scale:
 *   against the CPU backend's rmsnorm, geglu and scale ops; tolerance 1e-6.
 * main() also fails if a local layer's view never wrapped its ring or never
 * stopped short of the sequence's start (the local window in effect).
 */
#include "cuda_emu.h"

#include "cuda/kernel_args.cuh"
namespace emuk
{
#include "cuda/attention_kernels.cuh"
#include "cuda/elementwise_kernels.cuh"
} // namespace emuk
#define restrict __restrict__
extern "C" {
#include "backend.h"
#include "kvcache.h"
#include "rope.h"
}
#undef restrict

#include <string>

#define PREFILL_MIN_RUN 4 /* engine/cuda/backend_cuda.cu */
#define N_LAYER 3
#define HD 16
#define TMAX 16

static int g_failures, g_checks;
static bool g_wrapped, g_windowed;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float nrand(double sigma)
{
    /* sum of four uniforms, centred: enough spread for these checks */
    double s = 0;
    for (int i = 0; i < 4; i++) {
        g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (double)(g_rng >> 11) / 9007199254740992.0;
    }
    return (float)((s - 2.0) * sigma * 1.7320508);
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (std::isnan(a[i]) || std::isnan(b[i]))
            return INFINITY;
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

static void check(const std::string &name, double rel, double tol)
{
    g_checks++;
    const bool ok = rel <= tol;
    printf("emu-vs-cpu %s %.3g%s\n", name.c_str(), rel, ok ? "" : "  FAIL");
    if (!ok)
        g_failures++;
}

struct gemma_rig {
    model m;
    model_layer layers[N_LAYER];
    backend b;
    kv_geometry geo;
    cuda_kv_geo lgeo[N_LAYER];
    bool f16;
    std::vector<float> sinks0; /* the CPU op reads a sink logit even for softmax */
    /* the emulated device's KV buffers */
    std::vector<float> kf, vf;
    std::vector<__half> kh, vh;
    kv_seq seq[2];

    explicit gemma_rig(bool f16_) : f16(f16_)
    {
        memset(&m, 0, sizeof m);
        memset(layers, 0, sizeof layers);
        model_hparams &hp = m.hp;
        hp.arch_kind = MODEL_ARCH_GEMMA3;
        hp.n_layer = N_LAYER;
        hp.n_embd = 48;
        hp.n_head = 4;
        hp.n_head_kv = 2;
        hp.head_dim = HD;
        hp.n_ff = 40;
        hp.n_vocab = 8;
        hp.norm_eps = 1e-6f;
        hp.rope_dim = HD;
        hp.rope_neox = 1;
        hp.rope_base = 1e6;
        hp.rope_base_local = 1e4;
        hp.n_swa = 6;
        hp.swa_period = 3;
        hp.attn_scale = 0.41f;
        hp.normalizer = MODEL_NORM_SOFTMAX;
        m.w.layers = layers;
        backend_cpu_config cc = {1, TMAX, 0};
        char err[200];
        if (backend_cpu_init(&b, &m, &cc, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        memset(&geo, 0, sizeof geo);
        geo.n_layer = N_LAYER;
        geo.n_kv_head = hp.n_head_kv;
        geo.head_dim = HD;
        geo.n_sinks = 4;
        geo.window = 13;
        geo.chunk = 8;
        geo.n_slots = 2;
        geo.dtype = f16 ? KV_DTYPE_F16 : KV_DTYPE_F32;
        geo.swa_period = hp.swa_period;
        geo.swa_window = hp.n_swa;
        if (b.ops->kv_alloc(&b, &geo) != 0) {
            fprintf(stderr, "kv_alloc failed\n");
            exit(1);
        }
        for (int l = 0; l < N_LAYER; l++)
            lgeo[l] = cuda_kv_geo_for(&geo, l); /* as cuda_kv_alloc */
        const size_t n = (size_t)lgeo[0].per_slot * (size_t)geo.n_slots;
        kf.assign(n, NAN);
        vf.assign(n, NAN);
        __half hn;
        hn.x = 0x7e00;
        kh.assign(n, hn);
        vh.assign(n, hn);
        sinks0.assign((size_t)hp.n_head, 0.0f);
        kv_policy pa = {KV_POLICY_SINKS, 4}, pb = {KV_POLICY_WINDOW, 0};
        if (kv_seq_init(&seq[0], &geo, 0, pa, geo.window, 0) != 0 ||
            kv_seq_init(&seq[1], &geo, 1, pb, geo.window, 1000000007) != 0) {
            fprintf(stderr, "kv_seq_init failed\n");
            exit(1);
        }
    }
    ~gemma_rig()
    {
        b.ops->free(&b);
    }

    /* one step: n[i] tokens of sequence i */
    void step(int si, const int64_t n[2])
    {
        const model_hparams &hp = m.hp;
        const int H = hp.n_head, Hkv = hp.n_head_kv, rd = hp.rope_dim;
        /* build_batch */
        std::vector<int32_t> tokens;
        std::vector<int64_t> pos, slot, cell, cell_local;
        std::vector<kv_view> view, view_local;
        std::vector<const kv_seq *> sq;
        for (int i = 0; i < 2; i++) {
            if (n[i] == 0)
                continue;
            if (kv_seq_can_append(&seq[i], &geo, n[i]) != 0) {
                fprintf(stderr, "test bug: step %d cannot append\n", si);
                exit(1);
            }
            const kv_seq local = kv_seq_local(&seq[i], &geo);
            for (int64_t j = 0; j < n[i]; j++) {
                const int64_t p = seq[i].pos_next + j;
                tokens.push_back((int32_t)(p % hp.n_vocab));
                pos.push_back(p);
                slot.push_back(seq[i].slot);
                cell.push_back(kv_seq_cell(&seq[i], p));
                view.push_back(kv_seq_view(&seq[i], p));
                cell_local.push_back(kv_seq_cell(&local, p));
                view_local.push_back(kv_seq_view(&local, p));
                sq.push_back(&seq[i]);
                const kv_view &vl = view_local.back();
                kv_run r[KV_VIEW_RUNS];
                kv_view_runs(&local, &vl, r);
                if (r[2].len > 0)
                    g_wrapped = true;
                if (vl.win_start > seq[i].pos_first)
                    g_windowed = true;
            }
        }
        const int64_t T = (int64_t)pos.size();
        fwd_batch bt;
        memset(&bt, 0, sizeof bt);
        bt.T = T;
        bt.tokens = tokens.data();
        bt.pos = pos.data();
        bt.slot = slot.data();
        bt.cell = cell.data();
        bt.view = view.data();
        bt.seq = sq.data();
        bt.cell_local = cell_local.data();
        bt.view_local = view_local.data();
        if (b.ops->begin_step(&b, &bt) != 0) {
            fprintf(stderr, "begin_step failed\n");
            exit(1);
        }

        /* cuda_begin_step's metadata */
        std::vector<cuda_tok> tok(T), tok_local(T);
        std::vector<float> cs_abs(T * rd), cs_cache(T * rd), cs_local(T * rd);
        std::vector<int32_t> dec;
        std::vector<cuda_tile> tiles, tiles_local;
        for (int64_t t = 0; t < T; t++) {
            cuda_tok_pack(&tok[t], sq[t], &view[t], slot[t], cell[t], tokens[t]);
            const kv_seq sl = kv_seq_local(sq[t], &geo);
            cuda_tok_pack(&tok_local[t], &sl, &view_local[t], slot[t], cell_local[t], tokens[t]);
            rope_cos_sin(pos[t], hp.rope_base, rd, cs_abs.data() + t * rd);
            rope_cos_sin(view[t].pos_cache, hp.rope_base, rd, cs_cache.data() + t * rd);
            rope_cos_sin(pos[t], hp.rope_base_local, rd, cs_local.data() + t * rd);
        }
        const int G = H / Hkv, tile_tokens = emuk::att_tile_tokens(HD, G);
        for (int64_t t = 0; t < T;) {
            int64_t e = t + 1;
            while (e < T && sq[e] == sq[t] && pos[e] == pos[e - 1] + 1)
                e++;
            if (e - t >= PREFILL_MIN_RUN) {
                for (int64_t f = t; f < e; f += tile_tokens) {
                    const int64_t c = e - f < tile_tokens ? e - f : tile_tokens;
                    const kv_seq sl = kv_seq_local(sq[t], &geo);
                    tiles_local.push_back(
                        cuda_tile_pack(tok_local.data(), &sl, (int32_t)f, (int32_t)c));
                    tiles.push_back(cuda_tile_pack(tok.data(), sq[t], (int32_t)f, (int32_t)c));
                }
            } else {
                for (int64_t f = t; f < e; f++)
                    dec.push_back((int32_t)f);
            }
            t = e;
        }
        int64_t most_keys = geo.n_sinks + geo.window;
        if (geo.swa_window > most_keys)
            most_keys = geo.swa_window;
        const int n_split = (int)((most_keys + CUDA_ATT_SPLIT - 1) / CUDA_ATT_SPLIT);

        const std::string kvn = f16 ? "f16" : "f32";
        const size_t dq = (size_t)H * HD, dk = (size_t)Hkv * HD;
        for (int l = 0; l < N_LAYER; l++) {
            const std::string name = kvn + ".step" + std::to_string(si) + ".layer" +
                                     std::to_string(l) + (l % 3 == 2 ? "(global)" : "(local)");
            std::vector<float> q(T * dq), k(T * dk), v(T * dk);
            for (auto &x : q)
                x = nrand(1.0);
            for (auto &x : k)
                x = nrand(1.0);
            for (auto &x : v)
                x = nrand(1.0);
            /* the CPU backend, on its own activation buffers */
            backend_acts &a = b.acts;
            memcpy(a.q, q.data(), q.size() * 4);
            memcpy(a.k, k.data(), k.size() * 4);
            memcpy(a.v, v.data(), v.size() * 4);
            b.ops->rope(&b, l, a.q, a.qc, a.k);
            b.ops->kv_store(&b, l, a.k, a.v);
            b.ops->attention(&b, l, a.q, a.qc, sinks0.data(), hp.normalizer, a.att, NULL);

            /* the emulated kernels, as issue() launches them */
            std::vector<float> eq = q, eqc(T * dq, NAN), ek = k;
            const int local = model_layer_is_local(&hp, l);
            const int kv_local = kv_geometry_layer_is_local(&geo, l);
            {
                float *qp = eq.data(), *qcp = eqc.data(), *kp = ek.data();
                const float *ap = local ? cs_local.data() : cs_abs.data();
                const float *cp = local ? cs_local.data() : cs_cache.data();
                const int neox = hp.rope_neox;
                emu_launch(
                    dim3((unsigned)T), dim3(128), 0,
                    [&] { emuk::rope_kernel(qp, qcp, kp, ap, cp, H, Hkv, HD, rd, neox); },
                    "rope_kernel");
            }
            double e = rel_err(eq.data(), a.q, eq.size());
            e = fmax(e, rel_err(eqc.data(), a.qc, eqc.size()));
            e = fmax(e, rel_err(ek.data(), a.k, ek.size()));
            check(name + ".rope", e, 1e-6);

            const cuda_tok *tp = kv_local ? tok_local.data() : tok.data();
            const cuda_kv_geo kg = lgeo[l];
            const float *kk = ek.data(), *vv = v.data();
            if (f16) {
                __half *pk = kh.data(), *pv = vh.data();
                emu_launch(
                    dim3((unsigned)T), dim3(128), 0,
                    [&] { emuk::kv_store_kernel<__half>(kk, vv, pk, pv, tp, kg, Hkv, HD); },
                    "kv_store_kernel");
            } else {
                float *pk = kf.data(), *pv = vf.data();
                emu_launch(
                    dim3((unsigned)T), dim3(128), 0,
                    [&] { emuk::kv_store_kernel<float>(kk, vv, pk, pv, tp, kg, Hkv, HD); },
                    "kv_store_kernel");
            }

            std::vector<float> out(T * dq, NAN), stats(T * H * 2, NAN);
            std::vector<__half> out_h(T * dq);
            std::vector<float> part((size_t)T * Hkv * n_split * G * (HD + 2), NAN);
            cuda_attn_args aa;
            memset(&aa, 0, sizeof aa);
            aa.q = eq.data();
            aa.qc = eqc.data();
            aa.out = out.data();
            aa.out_h = out_h.data();
            aa.stats = stats.data();
            aa.k = f16 ? (const void *)kh.data() : (const void *)kf.data();
            aa.v = f16 ? (const void *)vh.data() : (const void *)vf.data();
            aa.tok = tp;
            aa.dec = dec.data();
            aa.tiles = kv_local ? tiles_local.data() : tiles.data();
            aa.part = part.data();
            aa.sinks = NULL;
            aa.geo = kg;
            aa.layer = l;
            aa.norm = hp.normalizer;
            aa.H = H;
            aa.Hkv = Hkv;
            aa.G = G;
            aa.Dh = HD;
            aa.n_split = n_split;
            aa.tile_tokens = tile_tokens;
            aa.scale = hp.attn_scale; /* as issue_attention */
            const unsigned n_tiles = (unsigned)tiles.size(), n_dec = (unsigned)dec.size();
            if (n_tiles > 0) {
                if (f16)
                    emu_launch(
                        dim3(n_tiles, Hkv), dim3(ATT_THREADS),
                        emuk::prefill_smem(HD, G, tile_tokens),
                        [&] { emuk::attention_prefill_kernel<__half, HD>(aa); }, "prefill");
                else
                    emu_launch(
                        dim3(n_tiles, Hkv), dim3(ATT_THREADS),
                        emuk::prefill_smem(HD, G, tile_tokens),
                        [&] { emuk::attention_prefill_kernel<float, HD>(aa); }, "prefill");
            }
            if (n_dec > 0) {
                if (f16)
                    emu_launch(
                        dim3(n_split, Hkv, n_dec), dim3(ATT_THREADS), emuk::split_smem(HD, G),
                        [&] { emuk::attention_split_kernel<__half, HD>(aa); }, "split");
                else
                    emu_launch(
                        dim3(n_split, Hkv, n_dec), dim3(ATT_THREADS), emuk::split_smem(HD, G),
                        [&] { emuk::attention_split_kernel<float, HD>(aa); }, "split");
                emu_launch(
                    dim3(n_dec, H), dim3(HD), 0, [&] { emuk::attention_merge_kernel<HD>(aa); },
                    "merge");
            }
            check(name + ".attention", rel_err(out.data(), a.att, out.size()), 1e-4);
        }
        for (int i = 0; i < 2; i++)
            kv_seq_advance(&seq[i], n[i]);
    }

    /* per-head rmsnorm, geglu and scale against the CPU backend's ops */
    void elementwise()
    {
        const model_hparams &hp = m.hp;
        const int64_t T = 5, H = hp.n_head, D = hp.n_embd, F = hp.n_ff;
        backend_acts &a = b.acts;
        {
            std::vector<float> x(T * H * HD), w(HD);
            for (size_t i = 0; i < x.size(); i++)
                x[i] = nrand(1.0) * (float)(1 + i / HD); /* rows of different scales */
            for (auto &e : w)
                e = 1.0f + nrand(0.3);
            tensor tw;
            memset(&tw, 0, sizeof tw);
            tw.data = w.data();
            tw.ne0 = HD;
            tw.ne1 = 1;
            memcpy(a.q, x.data(), x.size() * 4);
            b.ops->rmsnorm(&b, a.q, &tw, a.q, T * H); /* in place, as forward.c */
            std::vector<float> ex = x;
            std::vector<__half> eh(x.size());
            float *xp = ex.data();
            const float *wp = w.data();
            __half *hp16 = eh.data();
            const float eps = hp.norm_eps;
            emu_launch(
                dim3((unsigned)(T * H)), dim3(256), 0,
                [&] { emuk::rmsnorm_kernel(xp, wp, xp, hp16, HD, eps); }, "rmsnorm_kernel");
            check("per_head_rmsnorm", rel_err(ex.data(), a.q, ex.size()), 1e-6);
        }
        {
            const int64_t n = T * F;
            std::vector<float> g(n), u(n);
            for (int64_t i = 0; i < n; i++) {
                g[i] = nrand(3.0);
                u[i] = nrand(1.0);
            }
            g[0] = -30.0f; /* tanh saturates: -0 */
            g[1] = 30.0f;
            memcpy(a.hb, g.data(), n * 4);
            memcpy(a.hb2, u.data(), n * 4);
            b.ops->geglu(&b, a.hb, a.hb2, T);
            std::vector<float> eg = g;
            std::vector<__half> eh(n);
            float *gp = eg.data();
            const float *up = u.data();
            __half *hp16 = eh.data();
            emu_launch(
                dim3(1), dim3(256), 0, [&] { emuk::geglu_kernel(gp, up, hp16, n); },
                "geglu_kernel");
            check("geglu", rel_err(eg.data(), a.hb, eg.size()), 1e-6);
        }
        {
            const int64_t n = T * D;
            std::vector<float> x(n);
            for (auto &e : x)
                e = nrand(1.0);
            const float s = (float)sqrt((double)D); /* forward.c's embedding scale */
            memcpy(a.x, x.data(), n * 4);
            b.ops->scale(&b, a.x, s, T);
            float *xp = x.data();
            emu_launch(
                dim3(2), dim3(256), 0, [&] { emuk::scale_kernel(xp, s, n); }, "scale_kernel");
            check("scale", rel_err(x.data(), a.x, x.size()), 0);
        }
    }
};

int main()
{
    for (bool f16 : {false, true}) {
        gemma_rig r(f16);
        const int64_t s0[2] = {8, 8}, s1[2] = {8, 6}, s2[2] = {7, 0}, s3[2] = {1, 6};
        r.step(0, s0);
        r.step(1, s1);
        r.step(2, s2);
        r.step(3, s3);
        if (!f16)
            r.elementwise();
    }
    g_checks++;
    if (!g_wrapped || !g_windowed) {
        printf("coverage: local ring wrapped %d, local window in effect %d  FAIL\n", g_wrapped,
               g_windowed);
        g_failures++;
    }
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
