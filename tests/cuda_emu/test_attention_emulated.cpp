/*
 * test_attention_emulated.cpp: the real CUDA attention kernels
 * (engine/cuda/attention_kernels.cuh) run on the CPU through the execution
 * model emulation of cuda_emu.h, against the CPU reference attention
 * (engine/cpu/attention.c, cpu_attention_row). No GPU and no CUDA toolkit
 * needed: this is what holds the kernels to the CPU where
 * tests/invariants/test_cuda_matches_cpu.c skips.
 *
 * Shapes: Dh 16 and 64 with G = H/Hkv 2 and 3 (under three schedules, see
 * below), and Dh 32 / G 1, Dh 128 / G 8, Dh 256 / G 3 (forward schedule).
 * What runs, per (Dh, G, KV type f16/f32, normalizer):
 * - one layer (layer 1 of 2, Hkv = 2) of a step built exactly as
 *   cuda_begin_step builds it (runs of >= PREFILL_MIN_RUN consecutive tokens
 *   of one sequence go to prefill tiles of att_tile_tokens(Dh, G) tokens, the
 *   rest are decode tokens), with cuda_attn_args filled as issue_attention
 *   fills it, launched with attention.cu's shapes: prefill, then split-K +
 *   merge, then the probe;
 * - geometry S_max = 4, W_max = 300, chunk 32 (ring 332), n_split = 3;
 * - scenario "main": B window-only at position 1e9 with 200 tokens decodes 1
 *   (2 splits); A sinks:4 with 420 tokens (its window wrapped the ring)
 *   prefills 20 (tiles 16 + 4 where Dh allows); C dense with 9 tokens
 *   decodes 1;
 * - scenario "wrap": F sinks:4 with 500 tokens decodes 1 (304 keys: 3
 *   splits, window wrapped); E sinks:4 from position 5 prefills 24 tokens
 *   whose cells wrap around the ring inside the run; D sinks:4 from position
 *   7 with 2 tokens decodes 3 (the first two see zero window keys); S
 *   sinks:4 prefills its first 6 tokens (rows with sinks only, different
 *   sink counts in one tile); W window-only from 3e9+7 with 298 tokens
 *   prefills 5 (the window starts sliding inside the tile);
 * - scenario "low" (softpick's e^(-m) past float range): its queries are
 *   positive and some keys are -beta * (1, ..., 1), so that every query head
 *   of every token scores <= -150 on them (rig::lower_keys); the other keys
 *   score normally. L window-only with 299 tokens decodes 1 (300 keys, 3
 *   splits) with visit indices 128..255, all of split 1, low; P window-only
 *   with 40 tokens prefills 8 with its first 32 positions low (every row's
 *   first window key tile); Q sinks:4 with 40 tokens prefills 6 with its 4
 *   sinks low (every row's first tile is the sink tile). A running max that
 *   starts at -inf makes that block's max < -88 and e^(-m) = inf: with the
 *   pre-fix kernels (and pre-fix cpu_attention_row, which is first to see
 *   the low keys in P and Q) every softpick output of this scenario is NaN
 *   (split: l = inf, merge: inf * e^(m - M) = inf * 0; prefill: l = inf,
 *   then inf * 0 when the max moves), i.e. .decode, .prefill and .probe
 *   fail with REL inf, for every shape and both KV types; the other
 *   normalizers give the low keys ~0 weight and pass either way. The fix
 *   (softpick's running max floored at -64) gives the true answer: each low
 *   key adds e^(-M) to the denominator.
 * K/V cells that no stored token owns hold NaN, so a kernel that reads a cell
 * it must not read fails; the output, stats, partial-state and probe buffers
 * start as NaN with guard zones around them. main() also fails if one of the
 * cases listed above (3 splits, zero window keys, wraps, mixed sink counts,
 * partial and split tiles, positions past 2^31, a decode split and a
 * prefill row's first key tile scoring below -100) was not reached.
 *
 * The sink normalizer runs with sink values (cuda_attn_args.sinks_v, one
 * random vector per query head; head 0's logit 6 makes its output nearly
 * its v_h): the prefill accumulator starts at v_h, split 0 adds it with its
 * weight, the merge counts it once. It runs a second time ("NAME.keyed")
 * with per-token sink logits (cuda_attn_args.sink_logits, what
 * sink_key_logits_kernel writes for a layer with sink keys: here s_h plus
 * N(0, 3^2) per token and head), the CPU reference getting token t's own
 * logit for each row as backend_cpu.c passes it; the kernel that computes
 * them is held to cpu_sink_key_logits by test_elementwise_emulated.
 *
 * Checks, each printed as "emu-vs-cpu NAME REL" (REL = max |emu - cpu| over
 * max |cpu|, infinite on NaN):
 * - NAME.decode / NAME.prefill: the attention output rows of the decode and
 *   prefill tokens against cpu_attention_row for every (token, head), with
 *   attn_keys built like backend_cpu.c's keys_for;
 * - NAME.probe: the probe kernel's weights (from the stats the attention
 *   kernels left) against attention_probe_task's (weights on the sequence's
 *   first BACKEND_PROBE_K positions, 0 where a position left the cache);
 * - NAME.out_h: the f16 copy is exactly __float2half_rn(out) (REL is the
 *   number of mismatching values, must be 0);
 * - "emu-vs-emu NAME.reverse|shuffle REL": the same launches under other
 *   legal thread schedules give bit-identical out, out_h, stats and probe
 *   (REL is the number of differing values, must be 0): a race on shared
 *   memory would show here;
 * - "cpu-vs-f64 NAME.decode|prefill REL" (scenario "low" only):
 *   cpu_attention_row against the normalizers' formulas in double
 *   (rig::reference_f64), since a reference that overflowed like the
 *   kernels could agree with them.
 *
 * Tolerance 1e-4 (as test_cuda_matches_cpu.c's TOL_ATTN): both sides read the
 * same f16 (or f32) K/V and the same q/qc and compute in f32; they differ only
 * in the order of the float sums (8-wide partial dots and shuffle trees vs a
 * sequential dot; per-split and per-32-key-tile rescaling vs per key) over at
 * most 304 keys and Dh <= 256 terms, i.e. a few float ulps times sqrt of the
 * term counts, ~1e-6 of the output's scale. A wrong key, mask, scale or
 * normalizer term moves the output by far more than 1e-4.
 *
 * Exit 0 when all pass, 1 on a mismatch; the emulator aborts on a deadlock,
 * divergent barrier, misaligned vector access or shared-memory overflow, and
 * a watchdog aborts after 240 s.
 */
#include "cuda_emu.h"

extern "C" {
#include "support/rng.h"
}

#include "cuda/kernel_args.cuh"
/* The kernels in their own namespace: when the build has CUDA, ss_engine's
 * attention.cu host stubs carry the global names. */
namespace emuk
{
#include "cuda/attention_kernels.cuh"
}
#define restrict __restrict__
extern "C" {
#include "cpu/attention.h"
#include "kvcache.h"
}
#undef restrict

#include <string>

#define PREFILL_MIN_RUN 4 /* engine/cuda/backend_cuda.cu */
#define TOL_ATTN 1e-4
#define GUARD 64

static int g_failures, g_checks;
static double g_max_dec, g_max_pre, g_max_probe; /* largest errors, for the summary */

/* The cases the scenarios are meant to reach; main() fails if one never
 * happens (a change of geometry or tile size must not drop them silently). */
enum {
    COV_DEC_3_SPLITS,      /* a decode token with > 2 * CUDA_ATT_SPLIT keys */
    COV_DEC_ZERO_WINDOW,   /* a decode token that sees sinks only */
    COV_DEC_WINDOW_WRAPS,  /* a decode token whose window wraps the ring */
    COV_TILE_STORE_WRAPS,  /* a prefill tile whose own cells wrap the ring */
    COV_TILE_WINDOW_WRAPS, /* a prefill token whose window wraps the ring */
    COV_TILE_MIXED_SINKS,  /* tokens with different sink counts in one tile */
    COV_TILE_PARTIAL,      /* a tile with fewer than tile_tokens tokens */
    COV_RUN_SPLIT,         /* a run cut into several tiles */
    COV_FAR_POSITION,      /* positions past 2^31 */
    COV_DEC_SPLIT_LOW,     /* a split of a decode token with every score below -100 */
    COV_TILE_FIRST_LOW,    /* a prefill row whose first key tile scores below -100 */
    COV_N
};
static const char *const cov_name[COV_N] = {"decode token with 3 splits",
                                            "decode token with zero window keys",
                                            "decode window wrapping the ring",
                                            "prefill tile storing across the ring's end",
                                            "prefill window wrapping the ring",
                                            "prefill tile with mixed sink counts",
                                            "partial prefill tile",
                                            "run of several prefill tiles",
                                            "positions past 2^31",
                                            "decode split scoring below -100 throughout",
                                            "prefill row whose first key tile scores below -100"};
static bool g_cov[COV_N];

/* ---- deterministic random numbers ------------------------------------------------------------ */

static uint64_t g_rng = 0x5eed5eed12345678ull;
static float nrand(double sigma)
{
    return (float)(sigma * test_rng_normal(&g_rng));
}

/* ---- KV element helpers ---------------------------------------------------------------------- */

template <typename KV> KV kv_from(float x);
template <> __half kv_from<__half>(float x)
{
    return __float2half_rn(x);
}
template <> float kv_from<float>(float x)
{
    return x;
}
template <typename KV> KV kv_nan();
template <> __half kv_nan<__half>()
{
    __half h;
    h.x = 0x7e00;
    return h;
}
template <> float kv_nan<float>()
{
    return NAN;
}
static double kv_f64(__half x)
{
    return __half2float(x);
}
static double kv_f64(float x)
{
    return x;
}
template <typename KV> const char *kv_name();
template <> const char *kv_name<__half>()
{
    return "f16";
}
template <> const char *kv_name<float>()
{
    return "f32";
}

/* A buffer with guard zones on both sides (filled with `fill`). */
template <typename T> struct guarded {
    std::vector<T> mem;
    size_t n;
    T fill;
    guarded(size_t n_, T fill_) : mem(n_ + 2 * GUARD, fill_), n(n_), fill(fill_)
    {
    }
    T *data()
    {
        return mem.data() + GUARD;
    }
    const T *data() const
    {
        return mem.data() + GUARD;
    }
    T &operator[](size_t i)
    {
        return data()[i];
    }
    const T &operator[](size_t i) const
    {
        return data()[i];
    }
    bool guards_ok() const
    {
        for (size_t i = 0; i < GUARD; i++)
            if (memcmp(&mem[i], &fill, sizeof(T)) || memcmp(&mem[GUARD + n + i], &fill, sizeof(T)))
                return false;
        return true;
    }
};

/* ---- comparisons ----------------------------------------------------------------------------- */

static double rel_err(const std::vector<float> &a, const std::vector<float> &b)
{
    double d = 0, mx = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (std::isnan(e))
            return INFINITY;
        d = e > d ? e : d;
        mx = fabs((double)b[i]) > mx ? fabs((double)b[i]) : mx;
    }
    return mx > 0 ? d / mx : d;
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

static void require(bool ok, const std::string &what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what.c_str());
        g_failures++;
    }
}

/* ---- scenarios ------------------------------------------------------------------------------- */

struct seq_spec {
    const char *name;
    kv_policy_kind kind;
    int64_t n_sinks;
    int64_t pos_first;
    int64_t n_prior; /* tokens already stored */
    int64_t n_step;  /* tokens this step, consecutive */
    /* positions pos_first + low_first .. + low_n - 1 hold keys that every
     * query of the sequence scores below -100 (see rig::lower_keys) */
    int64_t low_first, low_n;
};

struct scenario {
    const char *name;
    std::vector<seq_spec> seqs; /* batch order: each sequence's tokens together */
};

static const std::vector<scenario> &scenarios()
{
    static const std::vector<scenario> s = {
        {"main",
         {
             {"B", KV_POLICY_WINDOW, 0, 1000000000, 200, 1, 0, 0},
             {"A", KV_POLICY_SINKS, 4, 0, 420, 20, 0, 0},
             {"C", KV_POLICY_DENSE, 0, 0, 9, 1, 0, 0},
         }},
        {"wrap",
         {
             {"F", KV_POLICY_SINKS, 4, 0, 500, 1, 0, 0},
             {"E", KV_POLICY_SINKS, 4, 5, 320, 24, 0, 0},
             {"D", KV_POLICY_SINKS, 4, 7, 2, 3, 0, 0},
             {"S", KV_POLICY_SINKS, 4, 1000, 0, 6, 0, 0},
             {"W", KV_POLICY_WINDOW, 0, 3000000007, 298, 5, 0, 0},
         }},
        {"low",
         {
             {"L", KV_POLICY_WINDOW, 0, 40000, 299, 1, 128, 128},
             {"P", KV_POLICY_WINDOW, 0, 70000, 40, 8, 0, 32},
             {"Q", KV_POLICY_SINKS, 4, 90000, 40, 6, 0, 4},
         }},
    };
    return s;
}

static const char *norm_name(int n)
{
    switch (n) {
    case MODEL_NORM_SOFTMAX:
        return "softmax";
    case MODEL_NORM_SOFTMAX1:
        return "softmax1";
    case MODEL_NORM_SINK:
        return "sink";
    default:
        return "softpick";
    }
}

/* ---- one step of one layer ------------------------------------------------------------------- */

#define N_LAYER 2
#define LAYER 1
#define HKV 2
#define S_MAX 4
#define W_MAX 300
#define CHUNK 32

template <typename KV, int DH> struct rig {
    int G, H;
    const scenario &sc;
    kv_geometry geo;
    cuda_kv_geo kgeo;
    int64_t T = 0;
    std::vector<KV> kmem, vmem;
    std::vector<kv_seq> seqs;
    std::vector<int64_t> pos;
    std::vector<int> seq_of; /* token -> index in seqs */
    std::vector<kv_view> view;
    std::vector<float> q, qc;
    std::vector<cuda_tok> tok;
    std::vector<int32_t> dec;
    std::vector<cuda_tile> tiles;
    int n_split, tile_tokens;

    rig(int G_, const scenario &sc_) : G(G_), H(HKV * G_), sc(sc_)
    {
        memset(&geo, 0, sizeof geo);
        geo.n_layer = N_LAYER;
        geo.n_kv_head = HKV;
        geo.head_dim = DH;
        geo.n_sinks = S_MAX;
        geo.window = W_MAX;
        geo.chunk = CHUNK;
        geo.n_slots = (int64_t)sc.seqs.size();
        geo.dtype = std::is_same<KV, __half>::value ? KV_DTYPE_F16 : KV_DTYPE_F32;
        /* as cuda_kv_alloc */
        kgeo = cuda_kv_geo_for(&geo, LAYER);
        n_split = (int)((geo.n_sinks + geo.window + CUDA_ATT_SPLIT - 1) / CUDA_ATT_SPLIT);
        tile_tokens = emuk::att_tile_tokens(DH, G);
        require(kv_geometry_slot_bytes(&geo) == (size_t)kgeo.per_slot * sizeof(KV),
                "slot bytes match the kernels' strides");
        require(kv_geometry_offset(&geo, 1, LAYER, 1, 5) ==
                    (size_t)(kgeo.per_slot + kgeo.layer_off + kgeo.per_head + 5 * DH),
                "kv_geometry_offset matches the kernels' strides");
        const size_t n = (size_t)kgeo.per_slot * geo.n_slots;
        kmem.assign(n, kv_nan<KV>());
        vmem.assign(n, kv_nan<KV>());

        /* the sequences' history, then the step's own K/V (attends to itself) */
        seqs.resize(sc.seqs.size());
        for (size_t i = 0; i < sc.seqs.size(); i++) {
            const seq_spec &sp = sc.seqs[i];
            kv_policy pol = {sp.kind, sp.n_sinks};
            if (kv_seq_init(&seqs[i], &geo, (int64_t)i, pol, W_MAX, sp.pos_first) != 0) {
                fprintf(stderr, "kv_seq_init failed for %s\n", sp.name);
                exit(1);
            }
            for (int64_t p = sp.pos_first; p < sp.pos_first + sp.n_prior; p++)
                store(i, p);
            kv_seq_advance(&seqs[i], sp.n_prior);
            if (kv_seq_can_append(&seqs[i], &geo, sp.n_step) != 0) {
                fprintf(stderr, "kv_seq_can_append refused %s\n", sp.name);
                exit(1);
            }
        }
        for (size_t i = 0; i < sc.seqs.size(); i++) {
            const seq_spec &sp = sc.seqs[i];
            for (int64_t k = 0; k < sp.n_step; k++) {
                const int64_t p = sp.pos_first + sp.n_prior + k;
                store(i, p);
                pos.push_back(p);
                seq_of.push_back((int)i);
            }
        }
        for (size_t i = 0; i < sc.seqs.size(); i++)
            kv_seq_advance(&seqs[i], sc.seqs[i].n_step);
        T = (int64_t)pos.size();
        for (int64_t t = 0; t < T; t++)
            view.push_back(kv_seq_view(&seqs[seq_of[t]], pos[t]));

        q.resize((size_t)T * H * DH);
        qc.resize(q.size());
        for (auto &x : q)
            x = nrand(1.5);
        for (auto &x : qc)
            x = nrand(1.5);
        lower_keys();

        /* cuda_begin_step's metadata */
        tok.resize(T);
        for (int64_t t = 0; t < T; t++) {
            const kv_seq &s = seqs[seq_of[t]];
            cuda_tok_pack(&tok[t], &s, &view[t], s.slot, kv_seq_cell(&s, pos[t]), (int32_t)t);
        }
        for (int64_t t = 0; t < T;) {
            int64_t e = t + 1;
            while (e < T && seq_of[e] == seq_of[t] && pos[e] == pos[e - 1] + 1)
                e++;
            if (e - t >= PREFILL_MIN_RUN) {
                for (int64_t f = t; f < e; f += tile_tokens) {
                    int64_t n = e - f < tile_tokens ? e - f : tile_tokens;
                    tiles.push_back(
                        cuda_tile_pack(tok.data(), &seqs[seq_of[t]], (int32_t)f, (int32_t)n));
                }
            } else {
                for (int64_t f = t; f < e; f++)
                    dec.push_back((int32_t)f);
            }
            t = e;
        }
        coverage();
    }

    /* The "low" keys (seq_spec.low_first, low_n): the queries (q and qc) of
     * such a sequence get positive entries 0.25 + |N(0, 1.5)|, and each low
     * key of kv head g is the constant row -beta_g, beta_g an integer (exact
     * in f16) such that every query head of the group, for every token of the
     * sequence, scores <= -150 on it. Its other keys score normally. */
    void lower_keys()
    {
        const double scale = 1.0f / sqrtf((float)DH);
        for (size_t i = 0; i < sc.seqs.size(); i++) {
            const seq_spec &sp = sc.seqs[i];
            if (sp.low_n == 0)
                continue;
            require(sp.n_prior + sp.n_step <= W_MAX && sp.low_first + sp.low_n <= sp.n_prior,
                    std::string("low keys of ") + sp.name + " stored and not evicted");
            double min_sum[HKV];
            for (int g = 0; g < HKV; g++)
                min_sum[g] = INFINITY;
            for (int64_t t = 0; t < T; t++) {
                if (seq_of[t] != (int)i)
                    continue;
                for (int h = 0; h < H; h++)
                    for (float *x : {q.data() + (t * H + h) * DH, qc.data() + (t * H + h) * DH}) {
                        double sum = 0;
                        for (int e = 0; e < DH; e++) {
                            x[e] = 0.25f + fabsf(nrand(1.5));
                            sum += x[e];
                        }
                        min_sum[h / G] = std::min(min_sum[h / G], sum);
                    }
            }
            for (int g = 0; g < HKV; g++) {
                const float beta = (float)ceil(150.0 / (scale * min_sum[g]));
                for (int64_t p = sp.pos_first + sp.low_first;
                     p < sp.pos_first + sp.low_first + sp.low_n; p++)
                    for (int l = 0; l < N_LAYER; l++) {
                        const size_t o =
                            kv_geometry_offset(&geo, seqs[i].slot, l, g, kv_seq_cell(&seqs[i], p));
                        for (int e = 0; e < DH; e++)
                            kmem[o + e] = kv_from<KV>(-beta);
                    }
            }
        }
    }

    /* token t's visit index v (sinks, then the window in position order) ->
     * cell, one position at a time (kv_seq_cell), independently of the runs
     * the kernels and the CPU reference walk */
    int64_t visit_cell(int64_t t, int64_t v) const
    {
        const kv_view &vw = view[t];
        const kv_seq &s = seqs[seq_of[t]];
        return kv_seq_cell(&s, v < vw.n_sinks ? s.pos_first + v : vw.win_start + v - vw.n_sinks);
    }

    /* query head h of token t on its key v, in double */
    double score(int64_t t, int h, int64_t v) const
    {
        const size_t o =
            kv_geometry_offset(&geo, seqs[seq_of[t]].slot, LAYER, h / G, visit_cell(t, v));
        const float *qq = (v < view[t].n_sinks ? qc : q).data() + (t * H + h) * DH;
        double s = 0;
        for (int e = 0; e < DH; e++)
            s += (double)qq[e] * kv_f64(kmem[o + e]);
        return s * (double)(1.0f / sqrtf((float)DH));
    }

    /* max of score(t, h, v) over v in [v0, v1) */
    double max_score(int64_t t, int h, int64_t v0, int64_t v1) const
    {
        double m = -INFINITY;
        for (int64_t v = v0; v < v1; v++)
            m = std::max(m, score(t, h, v));
        return m;
    }

    /* Do all G heads of kv head g of token t score below -100 on keys
     * [v0, v1), and above -64 somewhere (where softpick's floor does not
     * apply: the answer is the same with and without it)? */
    bool low_block(int64_t t, int g, int64_t v0, int64_t v1) const
    {
        const int64_t nk = view[t].n_sinks + view[t].win_len;
        for (int h = g * G; h < (g + 1) * G; h++)
            if (!(max_score(t, h, v0, v1) < -100 && max_score(t, h, 0, nk) > -64))
                return false;
        return true;
    }

    /* Does token t's window run past the ring's end (its last cell below its first)? */
    bool window_wraps(int64_t t) const
    {
        const kv_view &vw = view[t];
        return vw.win_len > 0 &&
               visit_cell(t, vw.n_sinks + vw.win_len - 1) < visit_cell(t, vw.n_sinks);
    }

    void coverage() const
    {
        for (int32_t d : dec) {
            const cuda_tok &k = tok[d];
            g_cov[COV_DEC_3_SPLITS] |= k.n_sinks + k.win_len > 2 * CUDA_ATT_SPLIT;
            g_cov[COV_DEC_ZERO_WINDOW] |= k.win_len == 0;
            g_cov[COV_DEC_WINDOW_WRAPS] |= window_wraps(d);
        }
        for (size_t i = 0; i < tiles.size(); i++) {
            const cuda_tile &tl = tiles[i];
            g_cov[COV_TILE_PARTIAL] |= tl.count < tile_tokens;
            if (i > 0 && seq_of[tiles[i - 1].first] == seq_of[tl.first])
                g_cov[COV_RUN_SPLIT] = true;
            for (int j = 0; j < tl.count; j++) {
                const cuda_tok &k = tok[tl.first + j];
                g_cov[COV_TILE_WINDOW_WRAPS] |= window_wraps(tl.first + j);
                if (j > 0) {
                    g_cov[COV_TILE_STORE_WRAPS] |= k.cell < tok[tl.first + j - 1].cell;
                    g_cov[COV_TILE_MIXED_SINKS] |= k.n_sinks != tok[tl.first].n_sinks;
                }
            }
        }
        for (int64_t p : pos)
            g_cov[COV_FAR_POSITION] |= p > INT32_MAX;

        /* softpick's e^-m: a split (split kernel) or a row's first key tile
         * (prefill_fold: the sink tile, else the window tile from p_lo, the
         * tile's lowest win_start, that holds the row's win_start) */
        for (int32_t d : dec) {
            const int64_t nk = tok[d].n_sinks + tok[d].win_len;
            for (int64_t v0 = 0; nk > CUDA_ATT_SPLIT && v0 < nk; v0 += CUDA_ATT_SPLIT)
                for (int g = 0; g < HKV; g++)
                    g_cov[COV_DEC_SPLIT_LOW] |=
                        low_block(d, g, v0, std::min<int64_t>(v0 + CUDA_ATT_SPLIT, nk));
        }
        for (const cuda_tile &tl : tiles) {
            const int64_t p_lo = tl.win_start;
            for (int j = 0; j < tl.count; j++) {
                const cuda_tok &k = tok[tl.first + j];
                int64_t n_first = std::min<int64_t>(k.n_sinks, PRE_KEYS);
                if (n_first == 0 && k.win_len > 0)
                    n_first = std::min(k.win_len,
                                       p_lo + ((k.win_start - p_lo) / PRE_KEYS + 1) * PRE_KEYS -
                                           k.win_start);
                for (int g = 0; n_first > 0 && g < HKV; g++)
                    g_cov[COV_TILE_FIRST_LOW] |= low_block(tl.first + j, g, 0, n_first);
            }
        }
    }

    /* random K and V for position p of sequence i, every layer and kv head */
    void store(size_t i, int64_t p)
    {
        const int64_t cell = kv_seq_cell(&seqs[i], p);
        for (int l = 0; l < N_LAYER; l++)
            for (int g = 0; g < HKV; g++) {
                const size_t o = kv_geometry_offset(&geo, seqs[i].slot, l, g, cell);
                for (int e = 0; e < DH; e++) {
                    kmem[o + e] = kv_from<KV>(nrand(1.0));
                    vmem[o + e] = kv_from<KV>(nrand(1.0));
                }
            }
    }

    bool is_decode(int64_t t) const
    {
        return std::find(dec.begin(), dec.end(), (int32_t)t) != dec.end();
    }

    /* The CPU reference: attention_probe_task for every (token, head). */
    void reference(int norm, const float *sinks, const float *sinks_v, std::vector<float> &out,
                   std::vector<float> &probe) const
    {
        attn_kernels kr;
        cpu_attention_kernels(&kr, 0);
        const float scale = 1.0f / sqrtf((float)DH);
        out.assign((size_t)T * H * DH, 0.0f);
        probe.assign((size_t)T * H * BACKEND_PROBE_K, 0.0f);
        for (int64_t t = 0; t < T; t++) {
            const kv_view *vw = &view[t];
            const kv_seq *seq = &seqs[seq_of[t]];
            for (int h = 0; h < H; h++) {
                /* keys_for */
                const size_t base = kv_geometry_offset(&geo, seq->slot, LAYER, h / G, 0);
                attn_keys keys;
                memset(&keys, 0, sizeof keys);
                keys.k = kmem.data() + base;
                keys.v = vmem.data() + base;
                keys.fmt = std::is_same<KV, __half>::value ? ATTN_F16 : ATTN_F32;
                keys.head_dim = DH;
                kv_run run[KV_VIEW_RUNS];
                kv_view_runs(seq, vw, run);
                for (int r = 0; r < KV_VIEW_RUNS; r++) {
                    keys.run_start[r] = run[r].cell;
                    keys.run_len[r] = run[r].len;
                    keys.run_uses_qc[r] = r == 0;
                }
                /* attention_probe_task */
                float visit_w[ATTN_PROBE_K];
                int64_t lim = seq->pos_first + BACKEND_PROBE_K;
                keys.probe = visit_w;
                keys.probe_n = vw->n_sinks;
                if (vw->win_len > 0 && vw->win_start < lim)
                    keys.probe_n +=
                        lim - vw->win_start < vw->win_len ? lim - vw->win_start : vw->win_len;
                const int64_t off = (t * H + h) * DH;
                cpu_attention_row(&kr, q.data() + off, qc.data() + off, &keys, scale,
                                  (model_normalizer)norm,
                                  tsinks  ? tsinks[t * H + h]
                                  : sinks ? sinks[h]
                                          : 0.0f,
                                  sinks_v ? sinks_v + (int64_t)h * DH : nullptr, out.data() + off);
                float *pr = probe.data() + (t * H + h) * BACKEND_PROBE_K;
                for (int64_t v = 0; v < keys.probe_n && v < ATTN_PROBE_K; v++) {
                    int64_t rel =
                        v < vw->n_sinks ? v : vw->win_start - seq->pos_first + v - vw->n_sinks;
                    if (rel < BACKEND_PROBE_K)
                        pr[rel] = visit_w[v];
                }
            }
        }
    }

    /* The normalizers from their definitions (DESIGN.md), in double, for the
     * "low" scenario: a CPU reference that overflowed there as the kernels do
     * would agree with them, so it is held to this. Softpick's m is the row's
     * max score: every row there scores above -64 somewhere, where the -64
     * floor of the running max changes nothing. */
    void reference_f64(int norm, const float *sinks, const float *sinks_v,
                       std::vector<float> &out) const
    {
        out.assign((size_t)T * H * DH, 0.0f);
        std::vector<double> z, o(DH);
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const int64_t nk = view[t].n_sinks + view[t].win_len;
                const bool virt = norm == MODEL_NORM_SOFTMAX1 || norm == MODEL_NORM_SINK;
                const double zs = norm != MODEL_NORM_SINK ? 0.0
                                  : tsinks                ? tsinks[t * H + h]
                                  : sinks                 ? sinks[h]
                                                          : 0.0;
                double m = virt ? zs : -INFINITY, l = 0.0;
                z.resize(nk);
                for (int64_t v = 0; v < nk; v++) {
                    z[v] = score(t, h, v);
                    m = std::max(m, z[v]);
                }
                if (virt)
                    l = exp(zs - m);
                if (!(m > -INFINITY))
                    continue;                /* no keys, no sink term: zeros */
                for (int e = 0; e < DH; e++) /* the sink's value, weight e^(s_h - m) */
                    o[e] = norm == MODEL_NORM_SINK && sinks_v
                               ? l * (double)sinks_v[(int64_t)h * DH + e]
                               : 0.0;
                for (int64_t v = 0; v < nk; v++) {
                    const size_t off = kv_geometry_offset(&geo, seqs[seq_of[t]].slot, LAYER, h / G,
                                                          visit_cell(t, v));
                    double w = exp(z[v] - m);
                    if (norm == MODEL_NORM_SOFTPICK) {
                        const double d = w - exp(-m);
                        l += fabs(d);
                        w = d > 0 ? d : 0.0;
                    } else {
                        l += w;
                    }
                    for (int e = 0; e < DH; e++)
                        o[e] += w * kv_f64(vmem[off + e]);
                }
                const double den = norm == MODEL_NORM_SOFTPICK ? l + (double)SOFTPICK_EPS : l;
                for (int e = 0; e < DH; e++)
                    out[(t * H + h) * DH + e] = (float)(o[e] / den);
            }
    }

    struct result {
        std::vector<float> out, stats, probe;
        std::vector<uint16_t> out_h;
    };

    /* The emulated kernels, launched as attention.cu launches them. */
    result emulate(int norm, const float *sinks, const float *sinks_v, const std::string &name)
    {
        const float fnan = NAN;
        __half hnan;
        hnan.x = 0xffff;
        const int n_dec = (int)dec.size(), n_tiles = (int)tiles.size();
        guarded<float> out((size_t)T * H * DH, fnan), stats((size_t)T * H * 2, fnan);
        guarded<__half> out_h((size_t)T * H * DH, hnan);
        guarded<float> part((size_t)(n_dec > 0 ? n_dec : 1) * HKV * n_split * G * (DH + 2), fnan);
        guarded<float> probe((size_t)T * H * BACKEND_PROBE_K, fnan);

        /* issue_attention */
        cuda_attn_args a;
        memset(&a, 0, sizeof a);
        a.q = q.data();
        a.qc = qc.data();
        a.out = out.data();
        a.out_h = out_h.data();
        a.stats = stats.data();
        a.k = kmem.data();
        a.v = vmem.data();
        a.tok = tok.data();
        a.dec = dec.data();
        a.tiles = tiles.data();
        a.part = part.data();
        a.sinks = sinks;
        a.sinks_v = sinks_v;
        a.sink_logits = tsinks;
        a.geo = kgeo;
        a.layer = LAYER;
        a.norm = norm;
        a.H = H;
        a.Hkv = HKV;
        a.G = G;
        a.Dh = DH;
        a.n_split = n_split;
        a.tile_tokens = tile_tokens;
        a.scale = 1.0f / sqrtf((float)DH);

        /* cuda_attention_setup's shared-memory attributes bound every launch */
        const size_t split_attr = emuk::split_smem(DH, G);
        const size_t pre_attr = emuk::prefill_smem(DH, G, emuk::att_tile_tokens(DH, G));

        /* cuda_attention_prefill */
        if (n_tiles > 0) {
            const size_t smem = emuk::prefill_smem(DH, a.G, a.tile_tokens);
            require(smem <= pre_attr, name + ": prefill smem within its attribute");
            emu_launch(
                dim3(n_tiles, a.Hkv), dim3(ATT_THREADS), smem,
                [&] { emuk::attention_prefill_kernel<KV, DH>(a); }, "attention_prefill_kernel");
        }
        /* cuda_attention_decode */
        if (n_dec > 0) {
            const size_t smem = emuk::split_smem(DH, a.G);
            require(smem <= split_attr, name + ": split smem within its attribute");
            emu_launch(
                dim3(a.n_split, a.Hkv, n_dec), dim3(ATT_THREADS), smem,
                [&] { emuk::attention_split_kernel<KV, DH>(a); }, "attention_split_kernel");
            emu_launch(
                dim3(n_dec, a.H), dim3(DH), 0, [&] { emuk::attention_merge_kernel<DH>(a); },
                "attention_merge_kernel");
        }
        /* cuda_attention_probe */
        float *pp = probe.data();
        emu_launch(
            dim3((unsigned)T, a.H), dim3(BACKEND_PROBE_K), 0,
            [&] { emuk::attention_probe_kernel<KV, DH>(a, pp); }, "attention_probe_kernel");

        require(out.guards_ok() && out_h.guards_ok() && stats.guards_ok() && part.guards_ok() &&
                    probe.guards_ok(),
                name + ": a kernel wrote outside its buffers");
        result r;
        r.out.assign(out.data(), out.data() + out.n);
        r.stats.assign(stats.data(), stats.data() + stats.n);
        r.probe.assign(probe.data(), probe.data() + probe.n);
        r.out_h.resize(out_h.n);
        for (size_t i = 0; i < out_h.n; i++)
            r.out_h[i] = out_h[i].x;
        return r;
    }

    void rows(const std::vector<float> &x, bool decode, std::vector<float> &dst) const
    {
        dst.clear();
        for (int64_t t = 0; t < T; t++)
            if (is_decode(t) == decode)
                dst.insert(dst.end(), x.begin() + t * H * DH, x.begin() + (t + 1) * H * DH);
    }

    /* per-token sink logits (T, H) for the keyed run, or NULL */
    std::vector<float> per_token;
    const float *tsinks = nullptr;

    void run(int norm, bool all_schedules)
    {
        run_one(norm, all_schedules, false);
        if (norm == MODEL_NORM_SINK)
            run_one(norm, all_schedules, true);
    }

    void run_one(int norm, bool all_schedules, bool keyed)
    {
        const std::string name = "Dh" + std::to_string(DH) + ".G" + std::to_string(G) + "." +
                                 kv_name<KV>() + "." + norm_name(norm) + (keyed ? ".keyed" : "") +
                                 "." + sc.name;
        std::vector<float> sinks(H);
        for (int h = 0; h < H; h++)
            sinks[h] = nrand(1.5);
        sinks[0] = 6.0f; /* a sink that dominates the sum: it must count once */
        if (H > 2)
            sinks[2] = -6.0f;
        /* the keyed run: each token's own logits around s_h */
        per_token.assign((size_t)T * H, 0.0f);
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                per_token[(size_t)(t * H + h)] = sinks[h] + nrand(3.0);
        tsinks = keyed ? per_token.data() : nullptr;
        const float *sp = norm == MODEL_NORM_SINK ? sinks.data() : nullptr;
        /* sink values (blk.N.attn_sinks_v), N(0, 4): head 0's dominant sink
         * makes its output nearly v_0; softmax1 and softpick get none */
        std::vector<float> sinks_v((size_t)H * DH);
        for (float &x : sinks_v)
            x = nrand(2.0);
        const float *svp = norm == MODEL_NORM_SINK ? sinks_v.data() : nullptr;

        std::vector<float> ref_out, ref_probe;
        reference(norm, sp, svp, ref_out, ref_probe);
        std::vector<float> a, b;
        bool low = false;
        for (const seq_spec &s : sc.seqs)
            low |= s.low_n > 0;
        if (low) {
            std::vector<float> f64_out;
            reference_f64(norm, sp, svp, f64_out);
            for (bool decode : {true, false}) {
                rows(ref_out, decode, a);
                rows(f64_out, decode, b);
                check(name + (decode ? ".decode" : ".prefill"), rel_err(a, b), TOL_ATTN,
                      "cpu-vs-f64");
            }
        }
        cuda_emu::cfg().schedule = cuda_emu::SCHED_FORWARD;
        const result r = emulate(norm, sp, svp, name);

        if (!dec.empty()) {
            rows(r.out, true, a);
            rows(ref_out, true, b);
            const double e = rel_err(a, b);
            g_max_dec = std::max(g_max_dec, e);
            check(name + ".decode", e, TOL_ATTN);
        }
        if (!tiles.empty()) {
            rows(r.out, false, a);
            rows(ref_out, false, b);
            const double e = rel_err(a, b);
            g_max_pre = std::max(g_max_pre, e);
            check(name + ".prefill", e, TOL_ATTN);
        }
        const double ep = rel_err(r.probe, ref_probe);
        g_max_probe = std::max(g_max_probe, ep);
        check(name + ".probe", ep, TOL_ATTN);
        size_t bad = 0;
        for (size_t i = 0; i < r.out.size(); i++)
            bad += r.out_h[i] != quant_f32_to_f16(r.out[i]);
        check(name + ".out_h", (double)bad, 0.0);

        if (!all_schedules)
            return;
        for (int s : {cuda_emu::SCHED_REVERSE, cuda_emu::SCHED_SHUFFLE}) {
            cuda_emu::cfg().schedule = s;
            const result o = emulate(norm, sp, svp, name + "." + cuda_emu::schedule_name(s));
            cuda_emu::cfg().schedule = cuda_emu::SCHED_FORWARD;
            size_t diff = 0;
            for (size_t i = 0; i < r.out.size(); i++)
                diff += memcmp(&o.out[i], &r.out[i], 4) != 0 || o.out_h[i] != r.out_h[i];
            for (size_t i = 0; i < r.stats.size(); i++)
                diff += memcmp(&o.stats[i], &r.stats[i], 4) != 0;
            for (size_t i = 0; i < r.probe.size(); i++)
                diff += memcmp(&o.probe[i], &r.probe[i], 4) != 0;
            check(name + "." + cuda_emu::schedule_name(s), (double)diff, 0.0, "emu-vs-emu");
        }
    }
};

template <typename KV, int DH> static void run_dh(int G, bool all_schedules)
{
    for (const scenario &sc : scenarios()) {
        rig<KV, DH> r(G, sc);
        for (int norm :
             {MODEL_NORM_SOFTMAX, MODEL_NORM_SOFTMAX1, MODEL_NORM_SINK, MODEL_NORM_SOFTPICK})
            r.run(norm, all_schedules);
    }
}

template <typename KV> static void run_kv(int Dh, int G, bool all_schedules)
{
    switch (Dh) {
    case 16:
        return run_dh<KV, 16>(G, all_schedules);
    case 32:
        return run_dh<KV, 32>(G, all_schedules);
    case 64:
        return run_dh<KV, 64>(G, all_schedules);
    case 128:
        return run_dh<KV, 128>(G, all_schedules);
    case 256:
        return run_dh<KV, 256>(G, all_schedules);
    }
    fprintf(stderr, "unsupported Dh %d\n", Dh);
    exit(1);
}

int main()
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    emu_watchdog(240);
    struct shape {
        int Dh, G;
        bool all_schedules;
    };
    /* Dh 16 (the tiny model) and 64 (SmolLM2) with 2 and 3 heads per kv head:
     * everything, under three schedules; the other supported Dh and the
     * extreme group sizes under the forward schedule. */
    const shape shapes[] = {
        {16, 2, true},  {16, 3, true},   {64, 2, true},   {64, 3, true},
        {32, 1, false}, {128, 8, false}, {256, 3, false},
    };
    for (const shape &s : shapes) {
        run_kv<__half>(s.Dh, s.G, s.all_schedules);
        run_kv<float>(s.Dh, s.G, s.all_schedules);
    }
    for (int c = 0; c < COV_N; c++)
        require(g_cov[c], std::string("coverage: no ") + cov_name[c]);
    printf("emu-vs-cpu largest: decode %.3g prefill %.3g probe %.3g (tolerance %g)\n", g_max_dec,
           g_max_pre, g_max_probe, TOL_ATTN);
    printf("cuda_emu attention: %d checks, %d failed\n", g_checks, g_failures);
    if (g_failures) {
        fprintf(stderr,
                "FAILED: %d of the checks of the emulated CUDA attention kernels "
                "(see the FAIL lines above)\n",
                g_failures);
        return 1;
    }
    return 0;
}
