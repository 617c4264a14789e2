/*
 * test_elementwise_emulated.cpp: the real CUDA element-wise kernels
 * (engine/cuda/elementwise_kernels.cuh) run on the CPU through the execution
 * model emulation of cuda_emu.h, against the CPU backend's ops
 * (engine/cpu/backend_cpu.c), computed here independently from their
 * definitions. No GPU and no CUDA toolkit needed.
 *
 * Every kernel is launched with the shape backend_cuda.cu's issue() /
 * issue_step() gives it: embed <<<T, 256>>>, rmsnorm and add_rmsnorm
 * <<<rows, 256>>>, rope and kv_store <<<T, 128>>>, swiglu and add
 * <<<grid_for(n), 256>>>, gather <<<n_out, 256>>>.
 *
 * Shapes: "smollm2" (D 576, H 9, Hkv 3, Dh 64, F 1536, rope_dim 64, positions
 * from 1e9), "smollm2.rope48" (the same with rope_dim 48 < Dh, positions from
 * 3e9+7, past 2^31) and "odd" (D 48 < blockDim 256, H 3, Hkv 1, Dh 16, F 72,
 * rope_dim 10: 5 of 8 pairs rotated), each under three thread schedules
 * (forward, reverse, shuffle), plus "stride": swiglu over 683 x 1536 and add
 * over 1821 x 576 values, past grid_for's 4096 blocks x 256 threads, so the
 * grid-stride loops take a second lap (checked against the CPU under each
 * schedule: "stride", "stride.reverse", "stride.shuffle").
 *
 * Checks, each printed as "emu-vs-cpu NAME REL":
 * - NAME.rmsnorm, NAME.rmsnorm_inplace: against cpu_rmsnorm's arithmetic (sum
 *   of squares in double, here in one chain, then float); REL is the largest |emu - cpu| over the
 *   largest |cpu| of a row, over all rows (rows are scaled from 1e-3 to 1e3).
 *   Tolerance 1e-6: the kernel sums at most 3 squares per thread, then two
 *   5- and 3-level shuffle trees in float, a relative error below ~11 float
 *   ulps (6.6e-7) in the worst case, halved by the square root, plus a few
 *   roundings in /D, +eps, rsqrtf (2 ulp on the GPU) and x * inv * w: well
 *   under 1e-6; a wrong eps, D, weight or missing row term is far above it.
 * - NAME.add_rmsnorm: the same against add then the double loop; and
 *   NAME.add_rmsnorm.x / .fused (REL = number of differing values, must be
 *   0): x after the fused kernel is bit-identical to x + y, and out and out_h
 *   are bit-identical to add_kernel followed by rmsnorm_kernel in the
 *   emulator (the kernel's comment promises the same float operations).
 * - NAME.rope.q / .qc / .k: against rope_apply with rope_cos_sin's tables at
 *   the absolute position (q, k) and the in-cache position (qc). Tolerance
 *   1e-6: the same float products on both sides (0 here; on the GPU an FMA
 *   contraction changes the last bit of some pairs). NAME.rope.passthrough
 *   (count, must be 0): the pairs past rope_dim are bit-identical to the
 *   input in q and k and copied bit for bit into qc.
 * - NAME.sink_key.adjacent / .neox: sink_key_logits_kernel <<<T, 128>>> on
 *   the queries rotated at their absolute positions (rope_apply or
 *   rope_apply_neox on the host) against the definition s_h + scale q0 . k_g
 *   with the UNROTATED query, a double loop; REL is the largest
 *   |emu - ref| / (scale sum_e |q0_e k_e| + |s_h|) over tokens and heads.
 *   Tolerance 1e-5: f32 rotation of q and k_g (~1e-7 relative per element)
 *   and an f32 sum of Dh/2 pair terms in a 5-level shuffle tree; a key
 *   rotated at another position, the wrong kv head or pair layout is O(1).
 *   NAME.sink_key.cpu.*: cpu_sink_key_logits on the same input, the same
 *   bound (the function the CPU backend runs, held to the same definition).
 * - NAME.kv_store.f16 / .f32 (count, must be 0): two launches (layers 0 and
 *   2 of 3, tokens spread over 3 slots and sink, ring and last cells) into
 *   NaN-filled buffers; the whole buffers equal the expected ones built with
 *   kv_geometry_offset and quant_f32_to_f16 (nothing else written).
 * - NAME.swiglu: against g / (1 + expf(-g)) * u (cpu_swiglu), inputs up to
 *   |g| = 1e4 (expf overflows to inf); tolerance 1e-6 (the GPU's expf is
 *   within 2 ulp).
 * - NAME.add, NAME.gather, NAME.embed (count, must be 0): exact copies / sums.
 * - NAME.rmsnorm.out_h, .add_rmsnorm.out_h, .swiglu.out_h (count, must be 0):
 *   each f16 copy is exactly __float2half_rn of the f32 output.
 * - NAME.guards (count, must be 0): nothing written outside the buffers
 *   (NaN-filled guard zones around every buffer a kernel writes).
 * - "emu-vs-emu NAME.reverse|shuffle N": every output of every kernel is
 *   bit-identical under the other schedules (N = differing values, must be
 *   0): a race on the static shared memory of rmsnorm would show here.
 *
 * Exit 0 when all pass, 1 on a mismatch; the emulator aborts on a deadlock,
 * divergent barrier, a bad warp operation or a shared-memory overflow, and a
 * watchdog aborts after 240 s.
 */
#include "cuda_emu.h"

extern "C" {
#include "support/rng.h"
}

#include "cuda/kernel_args.cuh"
/* The kernels in their own namespace: when the build has CUDA, ss_engine's
 * backend_cuda.cu host stubs carry the global names. */
namespace emuk
{
#include "cuda/elementwise_kernels.cuh"
}
#define restrict __restrict__
extern "C" {
#include "cpu/sink_key.h"
#include "kvcache.h"
#include "rope.h"
}
#undef restrict

#include <map>
#include <string>

#define GUARD 64
#define TOL 1e-6
#define TOL_SINK_KEY 1e-5
#define THREADS 256      /* embed, rmsnorm, add_rmsnorm, swiglu, add, gather */
#define ROPE_THREADS 128 /* rope, kv_store */

static int g_failures, g_checks;
static double g_max_rms, g_max_rope, g_max_swiglu;

/* backend_cuda.cu's grid_for: blocks of 256 threads for a grid-stride loop. */
static unsigned grid_for(int64_t n)
{
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* ---- deterministic random numbers ------------------------------------------------------------ */

static uint64_t g_rng = 0x5eed5eed87654321ull;
static float nrand(double sigma)
{
    return (float)(sigma * test_rng_normal(&g_rng));
}
static std::vector<float> nvec(size_t n, double sigma)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = nrand(sigma);
    return v;
}

/* ---- buffers and comparisons ----------------------------------------------------------------- */

/* A device buffer with NaN-filled guard zones on both sides. */
template <typename T> struct guarded {
    std::vector<T> mem;
    size_t n;
    T fill;
    guarded(size_t n_, T fill_) : mem(n_ + 2 * GUARD, fill_), n(n_), fill(fill_)
    {
    }
    guarded(const std::vector<T> &v, T fill_) : guarded(v.size(), fill_)
    {
        std::copy(v.begin(), v.end(), data());
    }
    T *data()
    {
        return mem.data() + GUARD;
    }
    std::vector<T> vec() const
    {
        return std::vector<T>(mem.begin() + GUARD, mem.begin() + GUARD + n);
    }
    size_t bad_guards() const
    {
        size_t bad = 0;
        for (size_t i = 0; i < GUARD; i++)
            bad += (memcmp(&mem[i], &fill, sizeof(T)) != 0) +
                   (memcmp(&mem[GUARD + n + i], &fill, sizeof(T)) != 0);
        return bad;
    }
};

static float fnan()
{
    return NAN;
}
static __half hnan()
{
    __half h;
    h.x = 0x7fff;
    return h;
}

static std::vector<uint16_t> bits(const std::vector<__half> &v)
{
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); i++)
        r[i] = v[i].x;
    return r;
}

/* Largest |a - b| over the largest |b| of a row of `width`, over all rows;
 * infinite where either side is not finite and the bit patterns differ. */
static double rel_rows(const std::vector<float> &a, const std::vector<float> &b, size_t width)
{
    if (a.size() != b.size())
        return INFINITY;
    double worst = 0;
    for (size_t r0 = 0; r0 < b.size(); r0 += width) {
        double d = 0, mx = 0;
        for (size_t i = r0; i < r0 + width && i < b.size(); i++) {
            if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
                if (memcmp(&a[i], &b[i], 4) != 0)
                    return INFINITY;
                continue;
            }
            d = std::max(d, fabs((double)a[i] - (double)b[i]));
            mx = std::max(mx, fabs((double)b[i]));
        }
        worst = std::max(worst, mx > 0 ? d / mx : d);
    }
    return worst;
}

/* Number of values whose bit patterns differ. */
template <typename T> static size_t n_diff(const std::vector<T> &a, const std::vector<T> &b)
{
    if (a.size() != b.size())
        return std::max(a.size(), b.size());
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++)
        n += memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n;
}

static size_t f16_copy_bad(const std::vector<float> &f, const std::vector<uint16_t> &h)
{
    size_t bad = 0;
    for (size_t i = 0; i < f.size(); i++)
        bad += h[i] != quant_f32_to_f16(f[i]);
    return bad;
}

static void check(const std::string &name, double rel, double tol, const char *what = "emu-vs-cpu")
{
    g_checks++;
    printf("%s %s %.3g\n", what, name.c_str(), rel);
    if (!(rel <= tol)) {
        g_failures++;
        fprintf(stderr, "FAIL: %s %s: %.3g exceeds %.3g\n", what, name.c_str(), rel, tol);
    }
}

/* ---- one shape ------------------------------------------------------------------------------- */

struct shape {
    const char *name;
    int D, H, Hkv, Dh, F, rope_dim;
    int T;
    int64_t pos0;
    double rope_base;
};

#define KV_LAYERS 3
#define KV_SLOTS 3

/* Everything the emulated kernels wrote, by name, for the schedule comparison. */
struct outputs {
    std::map<std::string, std::vector<float>> f;
    std::map<std::string, std::vector<uint16_t>> h;
    size_t bad_guards = 0;
};

struct rig {
    const shape &s;
    const float eps = 1e-5f;
    const int V = 37; /* embedding rows */
    std::vector<float> x, y, w, q, k, v, hb, hb2, emb, cs_abs, cs_cache, sinks, sink_keys;
    std::vector<cuda_tok> tok;
    std::vector<int32_t> out_rows;
    std::vector<int> layers;
    kv_geometry geo;
    cuda_kv_geo kgeo;

    explicit rig(const shape &s_) : s(s_)
    {
        const int T = s.T, D = s.D;
        /* rows scaled from 1e-3 to 1e3, so that a missing 1/D or eps shows */
        x = nvec((size_t)T * D, 1.0);
        for (int t = 0; t < T; t++) {
            const float sc = powf(10.0f, -3.0f + 6.0f * (float)t / (float)(T > 1 ? T - 1 : 1));
            for (int i = 0; i < D; i++)
                x[(size_t)t * D + i] *= sc;
        }
        y = nvec((size_t)T * D, 0.5);
        w = nvec((size_t)D, 0.2);
        for (auto &e : w)
            e += 1.0f;
        q = nvec((size_t)T * s.H * s.Dh, 1.0);
        k = nvec((size_t)T * s.Hkv * s.Dh, 1.0);
        v = nvec((size_t)T * s.Hkv * s.Dh, 1.0);
        /* K values that f16 rounds on a tie, overflows, flushes to a subnormal */
        k[0] = 1.0f + 0x1p-11f;
        k[1] = 70000.0f;
        k[2] = 1e-7f;
        v[0] = -65520.0f;
        hb = nvec((size_t)T * s.F, 3.0);
        hb[0] = -1e4f; /* expf(1e4) = inf: -0 */
        hb[1] = 1e4f;
        hb[2] = -90.0f;
        hb[3] = 0.0f;
        hb2 = nvec((size_t)T * s.F, 1.0);
        emb = nvec((size_t)V * D, 1.0);
        sinks = nvec((size_t)s.H, 2.0);
        sink_keys = nvec((size_t)s.Hkv * s.Dh, 1.0);

        /* begin_step: cs tables at the absolute and in-cache positions */
        cs_abs.resize((size_t)T * s.rope_dim);
        cs_cache.resize((size_t)T * s.rope_dim);
        for (int t = 0; t < T; t++) {
            rope_cos_sin(s.pos0 + t, s.rope_base, s.rope_dim, cs_abs.data() + t * s.rope_dim);
            rope_cos_sin(4 + 13 * t, s.rope_base, s.rope_dim, cs_cache.data() + t * s.rope_dim);
        }

        /* KV geometry: 3 layers, 3 slots, 4 sinks, ring of 13 + 8 */
        memset(&geo, 0, sizeof geo);
        geo.n_layer = KV_LAYERS;
        geo.n_kv_head = s.Hkv;
        geo.head_dim = s.Dh;
        geo.n_sinks = 4;
        geo.window = 13;
        geo.chunk = 8;
        geo.n_slots = KV_SLOTS;
        kgeo = cuda_kv_geo_for(&geo, 0); /* as cuda_kv_alloc: cells and per_slot */
        layers = {0, KV_LAYERS - 1};

        tok.resize(T);
        for (int t = 0; t < T; t++) {
            memset(&tok[t], 0, sizeof tok[t]);
            tok[t].slot = t % KV_SLOTS;
            /* the last cell, a sink cell, ring cells: distinct per slot */
            const int64_t cells[] = {kgeo.cells - 1, 0, geo.n_sinks, 2, kgeo.cells - 2, 7, 11, 19};
            tok[t].cell = cells[t % 8];
            tok[t].token = t == 0 ? V - 1 : (int32_t)((t * 7) % V);
        }
        for (int t = 0; t < T; t++)
            for (int u = 0; u < t; u++)
                if (tok[t].slot == tok[u].slot && tok[t].cell == tok[u].cell) {
                    fprintf(stderr, "test bug: tokens %d and %d share a cell\n", u, t);
                    exit(1);
                }
        out_rows = {(int32_t)(T - 1), 0};
        if (T > 2)
            out_rows.push_back(T / 2);
    }

    /* ---- the CPU reference, from the definitions ---- */

    /* cpu_rmsnorm */
    std::vector<float> rmsnorm_ref(const std::vector<float> &in) const
    {
        std::vector<float> o(in.size());
        for (size_t t = 0; t < in.size() / s.D; t++) {
            const float *xr = in.data() + t * s.D;
            double ss = 0;
            for (int i = 0; i < s.D; i++)
                ss += (double)xr[i] * xr[i];
            const float inv = (float)(1.0 / sqrt(ss / (double)s.D + eps));
            for (int i = 0; i < s.D; i++)
                o[t * s.D + i] = xr[i] * inv * w[i];
        }
        return o;
    }

    static std::vector<float> add_ref(const std::vector<float> &a, const std::vector<float> &b)
    {
        std::vector<float> o(a.size());
        for (size_t i = 0; i < a.size(); i++)
            o[i] = a[i] + b[i];
        return o;
    }

    /* cpu_swiglu */
    static std::vector<float> swiglu_ref(const std::vector<float> &g, const std::vector<float> &u)
    {
        std::vector<float> o(g.size());
        for (size_t i = 0; i < g.size(); i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        return o;
    }

    /* cpu_rope: qc = q, then rope_apply at the absolute (q, k) and in-cache (qc)
     * positions */
    void rope_ref(std::vector<float> &rq, std::vector<float> &rqc, std::vector<float> &rk) const
    {
        const int64_t dq = (int64_t)s.H * s.Dh, dk = (int64_t)s.Hkv * s.Dh;
        rq = q;
        rqc = q;
        rk = k;
        for (int t = 0; t < s.T; t++) {
            rope_apply(rq.data() + t * dq, s.H, s.Dh, s.rope_dim, cs_abs.data() + t * s.rope_dim);
            rope_apply(rqc.data() + t * dq, s.H, s.Dh, s.rope_dim,
                       cs_cache.data() + t * s.rope_dim);
            rope_apply(rk.data() + t * dk, s.Hkv, s.Dh, s.rope_dim, cs_abs.data() + t * s.rope_dim);
        }
    }

    /* cpu_kv_store, for every layer in `layers`, into NaN-filled buffers */
    template <typename KV>
    void kv_ref(std::vector<KV> &K, std::vector<KV> &Vb, KV nan, KV (*conv)(float)) const
    {
        const size_t total = (size_t)kgeo.per_slot * KV_SLOTS;
        K.assign(total, nan);
        Vb.assign(total, nan);
        for (int layer : layers)
            for (int t = 0; t < s.T; t++)
                for (int g = 0; g < s.Hkv; g++) {
                    const size_t off = kv_geometry_offset(&geo, tok[t].slot, layer, g, tok[t].cell);
                    for (int e = 0; e < s.Dh; e++) {
                        const size_t src = ((size_t)t * s.Hkv + g) * s.Dh + e;
                        K[off + e] = conv(k[src]);
                        Vb[off + e] = conv(v[src]);
                    }
                }
    }

    /* ---- the emulated kernels, launched as backend_cuda.cu launches them ---- */

    template <typename KV> void emulate_kv(outputs &o, const char *tag, KV nan)
    {
        const size_t total = (size_t)kgeo.per_slot * KV_SLOTS;
        guarded<KV> K(total, nan), Vb(total, nan);
        guarded<float> dk(k, fnan()), dv(v, fnan());
        guarded<cuda_tok> dtok(tok, cuda_tok{});
        const unsigned T = (unsigned)s.T;
        const int Hkv = s.Hkv, Dh = s.Dh;
        KV *pk = K.data(), *pv = Vb.data();
        const float *kk = dk.data(), *vv = dv.data();
        const cuda_tok *tp = dtok.data();
        for (int layer : layers) {
            const cuda_kv_geo kg = cuda_kv_geo_for(&geo, layer); /* as cuda_kv_alloc */
            emu_launch(
                dim3(T), dim3(ROPE_THREADS), 0,
                [&] { emuk::kv_store_kernel<KV>(kk, vv, pk, pv, tp, kg, Hkv, Dh); },
                "kv_store_kernel");
        }
        o.bad_guards += K.bad_guards() + Vb.bad_guards();
        if (std::is_same<KV, float>::value) {
            o.f[std::string("kv_store.K.") + tag].resize(total);
            o.f[std::string("kv_store.V.") + tag].resize(total);
            memcpy(o.f[std::string("kv_store.K.") + tag].data(), K.data(), total * 4);
            memcpy(o.f[std::string("kv_store.V.") + tag].data(), Vb.data(), total * 4);
        } else {
            o.h[std::string("kv_store.K.") + tag].resize(total);
            o.h[std::string("kv_store.V.") + tag].resize(total);
            memcpy(o.h[std::string("kv_store.K.") + tag].data(), K.data(), total * 2);
            memcpy(o.h[std::string("kv_store.V.") + tag].data(), Vb.data(), total * 2);
        }
    }

    outputs emulate()
    {
        outputs o;
        const int T = s.T, D = s.D, H = s.H, Hkv = s.Hkv, Dh = s.Dh, rd = s.rope_dim;
        const float ep = eps;

        /* embed <<<T, 256>>> */
        {
            guarded<float> de(emb, fnan()), dx((size_t)T * D, fnan());
            guarded<cuda_tok> dtok(tok, cuda_tok{});
            const float *e = de.data();
            const cuda_tok *tp = dtok.data();
            float *xp = dx.data();
            emu_launch(
                dim3(T), dim3(THREADS), 0, [&] { emuk::embed_kernel(e, tp, xp, D); },
                "embed_kernel");
            o.bad_guards += dx.bad_guards();
            o.f["embed"] = dx.vec();
        }
        /* rmsnorm <<<rows, 256>>>: into another buffer, and in place */
        for (bool inplace : {false, true}) {
            guarded<float> dx(x, fnan()), dw(w, fnan()), dout((size_t)T * D, fnan());
            guarded<__half> dh((size_t)T * D, hnan());
            const float *xp = dx.data(), *wp = dw.data();
            float *op = inplace ? dx.data() : dout.data();
            __half *hp = dh.data();
            emu_launch(
                dim3(T), dim3(THREADS), 0, [&] { emuk::rmsnorm_kernel(xp, wp, op, hp, D, ep); },
                "rmsnorm_kernel");
            o.bad_guards += dx.bad_guards() + dout.bad_guards() + dh.bad_guards();
            const char *n = inplace ? "rmsnorm_inplace" : "rmsnorm";
            o.f[n] = inplace ? dx.vec() : dout.vec();
            o.h[std::string(n) + ".out_h"] = bits(dh.vec());
        }
        /* add_rmsnorm <<<rows, 256>>> (issue_step's fused pair), and the pair
         * it replaces: add <<<grid_for(n), 256>>> then rmsnorm */
        for (bool fused : {true, false}) {
            guarded<float> dx(x, fnan()), dy(y, fnan()), dw(w, fnan()), dout((size_t)T * D, fnan());
            guarded<__half> dh((size_t)T * D, hnan());
            float *xp = dx.data(), *op = dout.data();
            const float *yp = dy.data(), *wp = dw.data();
            __half *hp = dh.data();
            if (fused) {
                emu_launch(
                    dim3(T), dim3(THREADS), 0,
                    [&] { emuk::add_rmsnorm_kernel(xp, yp, wp, op, hp, D, ep); },
                    "add_rmsnorm_kernel");
            } else {
                const int64_t n = (int64_t)T * D;
                emu_launch(
                    dim3(grid_for(n)), dim3(THREADS), 0, [&] { emuk::add_kernel(xp, yp, n); },
                    "add_kernel");
                o.f["add"] = dx.vec();
                emu_launch(
                    dim3(T), dim3(THREADS), 0, [&] { emuk::rmsnorm_kernel(xp, wp, op, hp, D, ep); },
                    "rmsnorm_kernel");
            }
            o.bad_guards += dx.bad_guards() + dout.bad_guards() + dh.bad_guards();
            const std::string n = fused ? "add_rmsnorm" : "add+rmsnorm";
            o.f[n + ".x"] = dx.vec();
            o.f[n] = dout.vec();
            o.h[n + ".out_h"] = bits(dh.vec());
        }
        /* rope <<<T, 128>>> */
        {
            guarded<float> dq(q, fnan()), dqc(q.size(), fnan()), dk(k, fnan());
            guarded<float> da(cs_abs, fnan()), dc(cs_cache, fnan());
            float *qp = dq.data(), *qcp = dqc.data(), *kp = dk.data();
            const float *ap = da.data(), *cp = dc.data();
            emu_launch(
                dim3(T), dim3(ROPE_THREADS), 0,
                [&] { emuk::rope_kernel(qp, qcp, kp, ap, cp, H, Hkv, Dh, rd, 0); }, "rope_kernel");
            o.bad_guards += dq.bad_guards() + dqc.bad_guards() + dk.bad_guards();
            o.f["rope.q"] = dq.vec();
            o.f["rope.qc"] = dqc.vec();
            o.f["rope.k"] = dk.vec();
        }
        /* sink_key_logits <<<T, 128>>> on q rotated at the absolute positions,
         * in both pair layouts */
        for (int neox : {0, 1}) {
            const std::vector<float> qr = rotated_q(neox);
            guarded<float> dq(qr, fnan()), da(cs_abs, fnan()), ds(sinks, fnan());
            guarded<float> dk(sink_keys, fnan()), dout((size_t)T * H, fnan());
            const float *qp = dq.data(), *ap = da.data(), *sp = ds.data(), *kp = dk.data();
            float *op = dout.data();
            const float scale = 1.0f / sqrtf((float)Dh);
            emu_launch(
                dim3(T), dim3(ROPE_THREADS), 0,
                [&] {
                    emuk::sink_key_logits_kernel(qp, ap, sp, kp, op, H, Hkv, Dh, rd, neox, scale);
                },
                "sink_key_logits_kernel");
            o.bad_guards += dout.bad_guards();
            o.f[neox ? "sink_key.neox" : "sink_key.adjacent"] = dout.vec();
        }
        /* kv_store <<<T, 128>>>, per layer */
        emulate_kv<__half>(o, "f16", hnan());
        emulate_kv<float>(o, "f32", fnan());
        /* swiglu <<<grid_for(n), 256>>> */
        {
            const int64_t n = (int64_t)T * s.F;
            guarded<float> dg(hb, fnan()), du(hb2, fnan());
            guarded<__half> dh((size_t)n, hnan());
            float *gp = dg.data();
            const float *up = du.data();
            __half *hp = dh.data();
            emu_launch(
                dim3(grid_for(n)), dim3(THREADS), 0, [&] { emuk::swiglu_kernel(gp, up, hp, n); },
                "swiglu_kernel");
            o.bad_guards += dg.bad_guards() + dh.bad_guards();
            o.f["swiglu"] = dg.vec();
            o.h["swiglu.out_h"] = bits(dh.vec());
        }
        /* gather <<<n_out, 256>>> */
        {
            const int n_out = (int)out_rows.size();
            guarded<float> dx(x, fnan()), dxo((size_t)n_out * D, fnan());
            guarded<int32_t> dr(out_rows, -1);
            const float *xp = dx.data();
            float *xo = dxo.data();
            const int32_t *rp = dr.data();
            emu_launch(
                dim3(n_out), dim3(THREADS), 0, [&] { emuk::gather_kernel(xp, xo, rp, D); },
                "gather_kernel");
            o.bad_guards += dxo.bad_guards();
            o.f["gather"] = dxo.vec();
        }
        return o;
    }

    /* q rotated at the absolute positions on the host, adjacent or NEOX pairs */
    std::vector<float> rotated_q(int neox) const
    {
        std::vector<float> qr = q;
        for (int t = 0; t < s.T; t++)
            (neox ? rope_apply_neox : rope_apply)(qr.data() + (size_t)t * s.H * s.Dh, s.H, s.Dh,
                                                  s.rope_dim, cs_abs.data() + t * s.rope_dim);
        return qr;
    }

    /* The sink-key logits against their definition with the unrotated q:
     * the largest |got - ref| / (scale sum |q0 k| + |s_h|). */
    double sink_key_err(const std::vector<float> &got) const
    {
        const int G = s.H / s.Hkv;
        const double scale = 1.0 / sqrt((double)s.Dh);
        double worst = 0.0;
        for (int t = 0; t < s.T; t++)
            for (int h = 0; h < s.H; h++) {
                const float *q0 = q.data() + ((size_t)t * s.H + h) * s.Dh;
                const float *kg = sink_keys.data() + (size_t)(h / G) * s.Dh;
                double dot = 0.0, mag = 0.0;
                for (int e = 0; e < s.Dh; e++) {
                    dot += (double)q0[e] * kg[e];
                    mag += fabs((double)q0[e] * kg[e]);
                }
                const double ref = sinks[h] + scale * dot;
                const double e = fabs((double)got[(size_t)t * s.H + h] - ref) /
                                 (scale * mag + fabs((double)sinks[h]));
                worst = std::max(worst, e == e ? e : INFINITY); /* NaN: fail */
            }
        return worst;
    }

    /* ---- the checks ---- */

    void compare(const outputs &o, const std::string &name)
    {
        const int T = s.T, D = s.D;
        /* embed */
        std::vector<float> ref((size_t)T * D);
        for (int t = 0; t < T; t++)
            memcpy(&ref[(size_t)t * D], &emb[(size_t)tok[t].token * D], (size_t)D * 4);
        check(name + ".embed", (double)n_diff(o.f.at("embed"), ref), 0);

        /* rmsnorm */
        const std::vector<float> rn = rmsnorm_ref(x);
        for (const char *n : {"rmsnorm", "rmsnorm_inplace"}) {
            const double e = rel_rows(o.f.at(n), rn, D);
            g_max_rms = std::max(g_max_rms, e);
            check(name + "." + n, e, TOL);
            check(name + "." + n + ".out_h",
                  (double)f16_copy_bad(o.f.at(n), o.h.at(std::string(n) + ".out_h")), 0);
        }

        /* add, add_rmsnorm */
        const std::vector<float> xy = add_ref(x, y);
        check(name + ".add", (double)n_diff(o.f.at("add"), xy), 0);
        check(name + ".add_rmsnorm.x", (double)n_diff(o.f.at("add_rmsnorm.x"), xy), 0);
        {
            const double e = rel_rows(o.f.at("add_rmsnorm"), rmsnorm_ref(xy), D);
            g_max_rms = std::max(g_max_rms, e);
            check(name + ".add_rmsnorm", e, TOL);
        }
        check(name + ".add_rmsnorm.fused",
              (double)(n_diff(o.f.at("add_rmsnorm"), o.f.at("add+rmsnorm")) +
                       n_diff(o.h.at("add_rmsnorm.out_h"), o.h.at("add+rmsnorm.out_h"))),
              0);
        check(name + ".add_rmsnorm.out_h",
              (double)f16_copy_bad(o.f.at("add_rmsnorm"), o.h.at("add_rmsnorm.out_h")), 0);

        /* rope */
        std::vector<float> rq, rqc, rk;
        rope_ref(rq, rqc, rk);
        const std::pair<const char *, const std::vector<float> *> rp[] = {
            {"rope.q", &rq}, {"rope.qc", &rqc}, {"rope.k", &rk}};
        for (const auto &p : rp) {
            const double e = rel_rows(o.f.at(p.first), *p.second, s.Dh);
            g_max_rope = std::max(g_max_rope, e);
            check(name + "." + p.first, e, TOL);
        }
        size_t pass_bad = 0, n_pass = 0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < s.H + s.Hkv; h++)
                for (int e = s.rope_dim / 2 * 2; e < s.Dh; e++) {
                    n_pass++;
                    if (h < s.H) {
                        const size_t i = ((size_t)t * s.H + h) * s.Dh + e;
                        pass_bad += memcmp(&o.f.at("rope.q")[i], &q[i], 4) != 0;
                        pass_bad += memcmp(&o.f.at("rope.qc")[i], &q[i], 4) != 0;
                    } else {
                        const size_t i = ((size_t)t * s.Hkv + (h - s.H)) * s.Dh + e;
                        pass_bad += memcmp(&o.f.at("rope.k")[i], &k[i], 4) != 0;
                    }
                }
        check(name + ".rope.passthrough", (double)pass_bad, 0);

        /* sink-key logits: the kernel and cpu_sink_key_logits, both against
         * the definition */
        for (int neox : {0, 1}) {
            const std::string n = neox ? "sink_key.neox" : "sink_key.adjacent";
            check(name + "." + n, sink_key_err(o.f.at(n)), TOL_SINK_KEY);
            std::vector<float> cpu((size_t)T * s.H);
            const std::vector<float> qr = rotated_q(neox);
            cpu_sink_key_logits(qr.data(), T, s.H, s.Hkv, s.Dh, s.rope_dim, neox, cs_abs.data(),
                                sinks.data(), sink_keys.data(), 1.0f / sqrtf((float)s.Dh),
                                cpu.data());
            check(name + ".sink_key.cpu." + (neox ? "neox" : "adjacent"), sink_key_err(cpu),
                  TOL_SINK_KEY);
        }
        if ((s.rope_dim < s.Dh) != (n_pass > 0)) {
            fprintf(stderr, "FAIL: %s: rope passthrough coverage\n", name.c_str());
            g_failures++;
        }

        /* kv_store */
        {
            std::vector<uint16_t> K16, V16;
            kv_ref<uint16_t>(K16, V16, 0x7fff, quant_f32_to_f16);
            check(name + ".kv_store.f16",
                  (double)(n_diff(o.h.at("kv_store.K.f16"), K16) +
                           n_diff(o.h.at("kv_store.V.f16"), V16)),
                  0);
            std::vector<float> K32, V32;
            kv_ref<float>(K32, V32, fnan(), [](float f) { return f; });
            check(name + ".kv_store.f32",
                  (double)(n_diff(o.f.at("kv_store.K.f32"), K32) +
                           n_diff(o.f.at("kv_store.V.f32"), V32)),
                  0);
        }

        /* swiglu */
        {
            const double e = rel_rows(o.f.at("swiglu"), swiglu_ref(hb, hb2), s.F);
            g_max_swiglu = std::max(g_max_swiglu, e);
            check(name + ".swiglu", e, TOL);
            check(name + ".swiglu.out_h",
                  (double)f16_copy_bad(o.f.at("swiglu"), o.h.at("swiglu.out_h")), 0);
        }

        /* gather */
        {
            std::vector<float> g(out_rows.size() * D);
            for (size_t i = 0; i < out_rows.size(); i++)
                memcpy(&g[i * D], &x[(size_t)out_rows[i] * D], (size_t)D * 4);
            check(name + ".gather", (double)n_diff(o.f.at("gather"), g), 0);
        }
        check(name + ".guards", (double)o.bad_guards, 0);
    }

    void run()
    {
        cuda_emu::cfg().schedule = cuda_emu::SCHED_FORWARD;
        const outputs fwd = emulate();
        compare(fwd, s.name);
        for (int sch : {cuda_emu::SCHED_REVERSE, cuda_emu::SCHED_SHUFFLE}) {
            cuda_emu::cfg().schedule = sch;
            const outputs o = emulate();
            cuda_emu::cfg().schedule = cuda_emu::SCHED_FORWARD;
            size_t diff = o.bad_guards;
            for (const auto &p : fwd.f)
                diff += n_diff(o.f.at(p.first), p.second);
            for (const auto &p : fwd.h)
                diff += n_diff(o.h.at(p.first), p.second);
            check(std::string(s.name) + "." + cuda_emu::schedule_name(sch), (double)diff, 0,
                  "emu-vs-emu");
        }
    }
};

/* swiglu and add over more than grid_for's 4096 x 256 values: a second lap of
 * the grid-stride loop. */
static void run_stride(int sched)
{
    cuda_emu::cfg().schedule = sched;
    const std::string name =
        std::string("stride") + (sched == cuda_emu::SCHED_FORWARD ? "" : ".") +
        (sched == cuda_emu::SCHED_FORWARD ? "" : cuda_emu::schedule_name(sched));
    {
        const int64_t n = (int64_t)683 * 1536;
        std::vector<float> g = nvec((size_t)n, 3.0), u = nvec((size_t)n, 1.0);
        guarded<float> dg(g, fnan()), du(u, fnan());
        guarded<__half> dh((size_t)n, hnan());
        float *gp = dg.data();
        const float *up = du.data();
        __half *hp = dh.data();
        emu_launch(
            dim3(grid_for(n)), dim3(THREADS), 0, [&] { emuk::swiglu_kernel(gp, up, hp, n); },
            "swiglu_kernel");
        const std::vector<float> out = dg.vec();
        const double e = rel_rows(out, rig::swiglu_ref(g, u), 1536);
        g_max_swiglu = std::max(g_max_swiglu, e);
        check(name + ".swiglu", e, TOL);
        check(name + ".swiglu.out_h", (double)f16_copy_bad(out, bits(dh.vec())), 0);
        check(name + ".swiglu.guards", (double)(dg.bad_guards() + dh.bad_guards()), 0);
    }
    {
        const int64_t n = (int64_t)1821 * 576;
        std::vector<float> a = nvec((size_t)n, 1.0), b = nvec((size_t)n, 1.0);
        guarded<float> da(a, fnan()), db(b, fnan());
        float *ap = da.data();
        const float *bp = db.data();
        emu_launch(
            dim3(grid_for(n)), dim3(THREADS), 0, [&] { emuk::add_kernel(ap, bp, n); },
            "add_kernel");
        check(name + ".add", (double)n_diff(da.vec(), rig::add_ref(a, b)), 0);
        check(name + ".add.guards", (double)da.bad_guards(), 0);
    }
    cuda_emu::cfg().schedule = cuda_emu::SCHED_FORWARD;
}

int main()
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    emu_watchdog(240);
    const shape shapes[] = {
        {"smollm2", 576, 9, 3, 64, 1536, 64, 8, 1000000000, 100000.0},
        {"smollm2.rope48", 576, 9, 3, 64, 1536, 48, 4, 3000000007LL, 10000.0},
        {"odd", 48, 3, 1, 16, 72, 10, 5, 999999990, 10000.0},
    };
    for (const shape &s : shapes) {
        rig r(s);
        r.run();
    }
    for (int sch : {cuda_emu::SCHED_FORWARD, cuda_emu::SCHED_REVERSE, cuda_emu::SCHED_SHUFFLE})
        run_stride(sch);
    printf("emu-vs-cpu largest: rmsnorm %.3g rope %.3g swiglu %.3g (tolerance %g)\n", g_max_rms,
           g_max_rope, g_max_swiglu, TOL);
    printf("cuda_emu elementwise: %d checks, %d failed\n", g_checks, g_failures);
    if (g_failures) {
        fprintf(stderr,
                "FAILED: %d of the checks of the emulated CUDA element-wise kernels "
                "(see the FAIL lines above)\n",
                g_failures);
        return 1;
    }
    return 0;
}
