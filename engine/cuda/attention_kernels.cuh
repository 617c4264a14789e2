/*
 * attention_kernels.cuh: the fused attention kernels of the CUDA backend, the
 * hot path (device code only; the launchers are in attention.cu).
 *
 * Reference: engine/cpu/attention.c (cpu_attention_span + cpu_attention_merge),
 * which tests/invariants/test_cuda_matches_cpu.c holds these kernels to.
 *
 * Every query sees the keys kvcache.h gives it, read in place from the KV
 * buffers: its sequence's sink cells 0 .. n_sinks-1 (scored with qc, the query
 * rotated at its in-cache position) and its window, positions win_start ..
 * win_start+win_len-1 (scored with q), in the cells kv_view_runs gave the
 * host (kernel_args.cuh): the kernels walk runs and never see the ring.
 * Visit order: sinks, then the window in position order.
 *
 * Normalizers through one online pass (DESIGN.md): the running max starts at
 * s_h and the running sum at 1 (softmax1: s_h = 0; sink: the learned logit),
 * and for sink the accumulator at the sink's value v_h (a.sinks_v; zero
 * without it); with sink keys the logit is token t's own, a.sink_logits[t*H+h],
 * vanilla softmax at -inf and 0; softpick keeps relu(e^(z-m) - e^(-m)) as the
 * weight and |e^(z-m) - e^(-m)| in the denominator, both rescaled by
 * e^(m-m') when the max moves (m floored at SOFTPICK_M_FLOOR), and divides by
 * (sum + eps). A row with no keys and no sink term is zeros.
 *
 * Decode (attention_split_kernel + attention_merge_kernel, flash-decoding):
 * one launch for every decode token of the step, grid (split, kv head,
 * token). A block scores CUDA_ATT_SPLIT consecutive visit indices against
 * all G query heads of its kv head, so each K and V row is read once per
 * group (grouped-query aware), and writes a partial state (m, l, acc) per
 * head. The sink term (its weight, and its value e^(s_h - m) v_h in the
 * accumulator) lives in split 0's state only, so the exact merge adds it once. Splits are fixed by
 * visit index, never by batch size.
 *
 * Prefill (attention_prefill_kernel): one block per (tile of consecutive
 * tokens of one sequence, kv head). K/V tiles of 32 keys are staged in
 * shared memory once for all tokens and heads of the tile; each token masks
 * the keys outside its own sinks and window (the sliding-window causal mask).
 */
#ifndef SS_CUDA_ATTENTION_KERNELS_CUH
#define SS_CUDA_ATTENTION_KERNELS_CUH

#include <math.h>
#include <stdint.h>

#include "kernel_args.cuh"

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define PRE_KEYS 32              /* keys per prefill tile */
#define PRE_MAX_ROWS ATT_THREADS /* tokens x heads per prefill block */
#define PRE_MAX_TOKENS 16
#define PRE_SMEM_LIMIT (100 * 1024)
#define SOFTPICK_EPS 1e-6f
/* Softpick's running max starts at this floor, not -inf, so that e^(-m) stays
 * finite when a whole split or tile scores below -88 (the CPU's
 * ATTN_SOFTPICK_M_FLOOR, engine/cpu/attention.h, where the reason is spelled
 * out). */
#define SOFTPICK_M_FLOOR (-64.0f)

/* The block's dynamic shared memory as an array of T named `name`. (A macro so
 * that a CPU emulation of the execution model can compile these kernels;
 * tests/cuda_emu/.) */
#ifndef SS_DYNAMIC_SMEM
#define SS_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

/* ---- small device helpers ---------------------------------------------------------------- */

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Cell of visit index v: the v-th cell of the concatenated runs
 * (kv_view_runs, packed on the host; v below the runs' total length). */
__device__ __forceinline__ int64_t run_cell(const kv_run *run, int64_t v)
{
#pragma unroll
    for (int r = 0; r < KV_VIEW_RUNS - 1; r++) {
        if (v < run[r].len)
            return run[r].cell + v;
        v -= run[r].len;
    }
    return run[KV_VIEW_RUNS - 1].cell + v;
}

/* Eight consecutive values of a K or V row as f32 (zeros when !ok). */
__device__ __forceinline__ void load8(float *dst, const __half *src, bool ok)
{
    if (!ok) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            dst[i] = 0.0f;
        return;
    }
    uint4 raw = *reinterpret_cast<const uint4 *>(src);
    const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h2[i]);
        dst[2 * i] = f.x;
        dst[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void load8(float *dst, const float *src, bool ok)
{
    if (!ok) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            dst[i] = 0.0f;
        return;
    }
    float4 a = *reinterpret_cast<const float4 *>(src);
    float4 b = *reinterpret_cast<const float4 *>(src + 4);
    dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
    dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
}

__device__ __forceinline__ float to_f32(__half x)
{
    return __half2float(x);
}
__device__ __forceinline__ float to_f32(float x)
{
    return x;
}

/* The sink term's starting state for token t's query head h: (m, l). */
__device__ __forceinline__ void sink_init(const cuda_attn_args &a, int64_t t, int h, float *m,
                                          float *l)
{
    if (a.norm == MODEL_NORM_SOFTMAX1) {
        *m = 0.0f;
        *l = 1.0f;
    } else if (a.norm == MODEL_NORM_SINK) {
        *m = a.sink_logits ? a.sink_logits[t * a.H + h] : a.sinks ? a.sinks[h] : 0.0f;
        *l = 1.0f;
    } else if (a.norm == MODEL_NORM_SOFTPICK) { /* no virtual key; the floored frame */
        *m = SOFTPICK_M_FLOOR;
        *l = 0.0f;
    } else { /* softmax: no virtual key */
        *m = -INFINITY;
        *l = 0.0f;
    }
}

/* The sink term's value for query head h, column e, in the frame m = s_h:
 * v_h[e] for the sink normalizer with sink values, else 0. */
__device__ __forceinline__ float sink_value(const cuda_attn_args &a, int h, int e)
{
    return a.norm == MODEL_NORM_SINK && a.sinks_v ? a.sinks_v[(int64_t)h * a.Dh + e] : 0.0f;
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* ---- decode: split-K partial states -------------------------------------------------------- */

static inline size_t split_smem(int Dh, int G)
{
    /* qw[G][Dh], qs[G][Dh], z[G][SPLIT], red[WARPS][G][Dh], m[G], l[G] */
    return sizeof(float) * ((size_t)G * Dh * (2 + ATT_WARPS) + (size_t)G * CUDA_ATT_SPLIT + 2 * G);
}

template <typename KV, int DH>
__global__ void __launch_bounds__(ATT_THREADS) attention_split_kernel(cuda_attn_args a)
{
    constexpr int LPK = DH / 8;   /* lanes per key row, 8 values each */
    constexpr int KPW = 32 / LPK; /* key rows per warp per pass */
    SS_DYNAMIC_SMEM(float, smem);
    const int G = a.G;
    float *qw = smem;                     /* window queries  [G][DH] */
    float *qs = qw + G * DH;              /* sink queries    [G][DH] */
    float *z = qs + G * DH;               /* scores/weights  [G][SPLIT] */
    float *red = z + G * CUDA_ATT_SPLIT;  /* per-warp acc    [WARPS][G][DH] */
    float *mh = red + ATT_WARPS * G * DH; /* split max       [G] */
    float *lh = mh + G;                   /* split sum       [G] */

    const int split = blockIdx.x, g = blockIdx.y, d = blockIdx.z;
    const int t = a.dec[d];
    const cuda_tok tk = a.tok[t];
    const int64_t nk = tk.n_sinks + tk.win_len;
    const int64_t v0 = (int64_t)split * CUDA_ATT_SPLIT;
    if (v0 >= nk && split > 0)
        return; /* past this token's keys: the merge never reads it */
    const int n = (int)(nk - v0 < CUDA_ATT_SPLIT ? (nk > v0 ? nk - v0 : 0) : CUDA_ATT_SPLIT);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int sub = lane / LPK, piece = lane % LPK;

    const float *qg = a.q + ((int64_t)t * a.H + (int64_t)g * G) * DH;
    const float *qcg = a.qc + ((int64_t)t * a.H + (int64_t)g * G) * DH;
    for (int i = tid; i < G * DH; i += ATT_THREADS) {
        qw[i] = qg[i];
        qs[i] = qcg[i];
    }
    __syncthreads();

    const int64_t base = tk.slot * a.geo.per_slot + a.geo.layer_off + (int64_t)g * a.geo.per_head;
    const KV *K = static_cast<const KV *>(a.k) + base;
    const KV *V = static_cast<const KV *>(a.v) + base;

    /* 1. scores: LPK lanes per key row, reduced with shuffles inside the group */
    for (int j0 = warp * KPW; j0 < n; j0 += ATT_WARPS * KPW) {
        const int j = j0 + sub;
        const bool ok = j < n;
        const int64_t v = v0 + j;
        const int64_t cell = ok ? run_cell(tk.run, v) : 0;
        const bool sink = v < tk.n_sinks;
        float kf[8];
        load8(kf, K + cell * DH + piece * 8, ok);
#pragma unroll
        for (int h = 0; h < CUDA_ATT_MAXG; h++) {
            if (h >= G)
                break;
            const float *qq = (sink ? qs : qw) + h * DH + piece * 8;
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++)
                s += qq[e] * kf[e];
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, o);
            if (ok && piece == 0)
                z[h * CUDA_ATT_SPLIT + j] = s * a.scale;
        }
    }
    __syncthreads();

    /* 2. per head: the split's max, weights and sum (split 0 carries the sink term) */
    const bool softpick = a.norm == MODEL_NORM_SOFTPICK;
    for (int h = warp; h < G; h += ATT_WARPS) {
        float m0 = softpick ? SOFTPICK_M_FLOOR : -INFINITY, l0 = 0.0f;
        if (split == 0)
            sink_init(a, t, g * G + h, &m0, &l0);
        float mx = m0;
        for (int j = lane; j < n; j += 32)
            mx = fmaxf(mx, z[h * CUDA_ATT_SPLIT + j]);
        mx = warp_max(mx);
        float l = 0.0f;
        const float e0 = softpick ? expf(-mx) : 0.0f;
        for (int j = lane; j < n; j += 32) {
            float e = expf(z[h * CUDA_ATT_SPLIT + j] - mx);
            float w;
            if (softpick) {
                float dd = e - e0;
                l += fabsf(dd);
                w = dd > 0.0f ? dd : 0.0f;
            } else {
                l += e;
                w = e;
            }
            z[h * CUDA_ATT_SPLIT + j] = w;
        }
        l = warp_sum(l);
        if (lane == 0) {
            if (l0 > 0.0f)
                l += l0 * expf(m0 - mx); /* the virtual key: e^(s_h - m) */
            mh[h] = mx;
            lh[h] = l;
        }
    }
    __syncthreads();

    /* 3. acc[h] = sum_j w[h][j] v_j: each lane owns 8 columns of its key rows */
    float acc[CUDA_ATT_MAXG][8];
#pragma unroll
    for (int h = 0; h < CUDA_ATT_MAXG; h++)
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[h][e] = 0.0f;
    for (int j0 = warp * KPW; j0 < n; j0 += ATT_WARPS * KPW) {
        const int j = j0 + sub;
        const bool ok = j < n;
        const int64_t cell = ok ? run_cell(tk.run, v0 + j) : 0;
        float vf[8];
        load8(vf, V + cell * DH + piece * 8, ok);
#pragma unroll
        for (int h = 0; h < CUDA_ATT_MAXG; h++) {
            if (h >= G)
                break;
            const float w = ok ? z[h * CUDA_ATT_SPLIT + j] : 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[h][e] += w * vf[e];
        }
    }
    /* sum the key groups of the warp (lanes with the same piece) */
#pragma unroll
    for (int h = 0; h < CUDA_ATT_MAXG; h++) {
        if (h >= G)
            break;
#pragma unroll
        for (int e = 0; e < 8; e++)
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1)
                acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
    }
    if (sub == 0) {
#pragma unroll
        for (int h = 0; h < CUDA_ATT_MAXG; h++) {
            if (h >= G)
                break;
#pragma unroll
            for (int e = 0; e < 8; e++)
                red[(warp * G + h) * DH + piece * 8 + e] = acc[h][e];
        }
    }
    __syncthreads();

    float *part = a.part + (((int64_t)d * a.Hkv + g) * a.n_split + split) * (int64_t)G * (DH + 2);
    for (int i = tid; i < G * DH; i += ATT_THREADS) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            s += red[w * G * DH + i];
        if (split == 0 && a.norm == MODEL_NORM_SINK && a.sinks_v) {
            /* the sink's value with its weight e^(s_h - mx) in this split's frame */
            const int h = i / DH;
            float m0, l0;
            sink_init(a, t, g * G + h, &m0, &l0);
            s += l0 * expf(m0 - mh[h]) * sink_value(a, g * G + h, i % DH);
        }
        part[2 * G + i] = s;
    }
    if (tid < G) {
        part[tid] = mh[tid];
        part[G + tid] = lh[tid];
    }
}

/* One block per (decode token, query head), one thread per output column. */
template <int DH> __global__ void attention_merge_kernel(cuda_attn_args a)
{
    const int d = blockIdx.x, h = blockIdx.y, col = threadIdx.x;
    const int G = a.G, g = h / G, k = h % G;
    const int t = a.dec[d];
    const cuda_tok tk = a.tok[t];
    const int64_t nk = tk.n_sinks + tk.win_len;
    int ns = (int)((nk + CUDA_ATT_SPLIT - 1) / CUDA_ATT_SPLIT);
    if (ns < 1)
        ns = 1; /* split 0 always holds the sink term */
    const int64_t stride = (int64_t)G * (DH + 2);
    const float *p0 = a.part + ((int64_t)d * a.Hkv + g) * a.n_split * stride;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++)
        M = fmaxf(M, p0[s * stride + k]);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float m = p0[s * stride + k];
        if (!(m > -INFINITY))
            continue; /* no keys and no sink term in this split */
        const float c = expf(m - M);
        L += p0[s * stride + G + k] * c;
        o += c * p0[s * stride + 2 * G + k * DH + col];
    }
    if (a.norm == MODEL_NORM_SOFTPICK)
        o /= L + SOFTPICK_EPS;
    else
        o = L > 0.0f ? o / L : 0.0f;
    const int64_t off = ((int64_t)t * a.H + h) * DH + col;
    a.out[off] = o;
    a.out_h[off] = __float2half_rn(o);
    if (col == 0) {
        a.stats[((int64_t)t * a.H + h) * 2] = M;
        a.stats[((int64_t)t * a.H + h) * 2 + 1] = L;
    }
}

/* ---- prefill: tiles of tokens against tiles of keys ----------------------------------------- */

static inline size_t prefill_smem(int Dh, int G, int tile_tokens)
{
    const size_t R = (size_t)tile_tokens * G;
    /* q[R][Dh], acc[R][Dh], kf[KEYS][Dh+1], vf[KEYS][Dh], s[R][KEYS], m, l, corr [R] */
    return sizeof(float) *
           (2 * R * Dh + (size_t)PRE_KEYS * (2 * (size_t)Dh + 1) + R * PRE_KEYS + 3 * R);
}

static inline int att_tile_tokens(int Dh, int G)
{
    int n = PRE_MAX_TOKENS;
    while (n > 1 && (n * G > PRE_MAX_ROWS || prefill_smem(Dh, G, n) > PRE_SMEM_LIMIT))
        n--;
    return n;
}

/* Folds one tile of nkt keys (staged in kf/vf) into every row's running
 * state. visible(i, j): may token i of the tile see key j. */
template <int DH, typename Visible>
__device__ void prefill_fold(const cuda_attn_args &a, int rows, int nkt, const float *qb,
                             float *acc, const float *kf, const float *vf, float *s, float *m,
                             float *l, float *corr, Visible visible)
{
    const int tid = threadIdx.x;
    const int G = a.G;
    const bool softpick = a.norm == MODEL_NORM_SOFTPICK;
    for (int idx = tid; idx < rows * PRE_KEYS; idx += ATT_THREADS) {
        const int r = idx / PRE_KEYS, j = idx % PRE_KEYS;
        float zz = -INFINITY;
        if (j < nkt && visible(r / G, j)) {
            const float *qq = qb + r * DH;
            const float *kk = kf + j * (DH + 1);
            float dot = 0.0f;
#pragma unroll 8
            for (int e = 0; e < DH; e++)
                dot += qq[e] * kk[e];
            zz = dot * a.scale;
        }
        s[idx] = zz;
    }
    __syncthreads();
    if (tid < rows) {
        const int r = tid;
        float mt = -INFINITY;
        for (int j = 0; j < nkt; j++)
            mt = fmaxf(mt, s[r * PRE_KEYS + j]);
        const float mo = m[r], mn = fmaxf(mo, mt);
        float c = 1.0f;
        if (mn > -INFINITY) {
            c = expf(mo - mn); /* 0 when nothing was seen yet */
            const float e0 = softpick ? expf(-mn) : 0.0f;
            float add = 0.0f;
            for (int j = 0; j < PRE_KEYS; j++) {
                const float zz = s[r * PRE_KEYS + j];
                float w = 0.0f;
                if (zz > -INFINITY) { /* a visible key */
                    const float e = expf(zz - mn);
                    if (softpick) {
                        const float dd = e - e0;
                        add += fabsf(dd);
                        w = dd > 0.0f ? dd : 0.0f;
                    } else {
                        add += e;
                        w = e;
                    }
                }
                s[r * PRE_KEYS + j] = w;
            }
            l[r] = l[r] * c + add;
            m[r] = mn;
        } else {
            for (int j = 0; j < PRE_KEYS; j++)
                s[r * PRE_KEYS + j] = 0.0f;
        }
        corr[r] = c;
    }
    __syncthreads();
    for (int idx = tid; idx < rows * DH; idx += ATT_THREADS) {
        const int r = idx / DH, e = idx % DH;
        float o = acc[idx] * corr[r];
        const float *w = s + r * PRE_KEYS;
        for (int j = 0; j < nkt; j++)
            o += w[j] * vf[j * DH + e];
        acc[idx] = o;
    }
    __syncthreads();
}

template <typename KV, int DH>
__global__ void __launch_bounds__(ATT_THREADS) attention_prefill_kernel(cuda_attn_args a)
{
    SS_DYNAMIC_SMEM(float, smem);
    const cuda_tile tl = a.tiles[blockIdx.x];
    const int g = blockIdx.y, G = a.G, tid = threadIdx.x;
    const int nt = tl.count, rows = nt * G;
    const int R = a.tile_tokens * G;
    float *qb = smem;                     /* [R][DH] queries (qc, then q) */
    float *acc = qb + R * DH;             /* [R][DH] */
    float *kf = acc + R * DH;             /* [KEYS][DH+1] (padded: no bank conflicts) */
    float *vf = kf + PRE_KEYS * (DH + 1); /* [KEYS][DH] */
    float *s = vf + PRE_KEYS * DH;        /* [R][KEYS] */
    float *m = s + R * PRE_KEYS;          /* [R] */
    float *l = m + R;                     /* [R] */
    float *corr = l + R;                  /* [R] */

    const cuda_tok t0 = a.tok[tl.first]; /* every token of the tile shares the slot */
    const int64_t base = t0.slot * a.geo.per_slot + a.geo.layer_off + (int64_t)g * a.geo.per_head;
    const KV *K = static_cast<const KV *>(a.k) + base;
    const KV *V = static_cast<const KV *>(a.v) + base;

    if (tid < rows)
        sink_init(a, tl.first + tid / G, g * G + tid % G, &m[tid], &l[tid]);
    for (int idx = tid; idx < rows * DH; idx += ATT_THREADS) /* weight 1 in the frame m = s_h */
        acc[idx] = sink_value(a, g * G + (idx / DH) % G, idx % DH);

    /* the sinks, scored with the in-cache queries; token i sees cells < its n_sinks */
    int64_t max_sinks = 0;
    for (int i = 0; i < nt; i++)
        max_sinks = max64(max_sinks, a.tok[tl.first + i].n_sinks);
    if (max_sinks > 0) {
        for (int idx = tid; idx < rows * DH; idx += ATT_THREADS) {
            const int r = idx / DH, e = idx % DH, i = r / G, k = r % G;
            qb[idx] = a.qc[((int64_t)(tl.first + i) * a.H + g * G + k) * DH + e];
        }
        for (int64_t c0 = 0; c0 < max_sinks; c0 += PRE_KEYS) {
            const int nkt = (int)min64(PRE_KEYS, max_sinks - c0);
            __syncthreads();
            for (int idx = tid; idx < nkt * DH; idx += ATT_THREADS) {
                const int j = idx / DH, e = idx % DH;
                kf[j * (DH + 1) + e] = to_f32(K[(c0 + j) * DH + e]);
                vf[j * DH + e] = to_f32(V[(c0 + j) * DH + e]);
            }
            __syncthreads();
            prefill_fold<DH>(a, rows, nkt, qb, acc, kf, vf, s, m, l, corr,
                             [&](int i, int j) { return c0 + j < a.tok[tl.first + i].n_sinks; });
        }
    }

    /* the window, scored with the absolute-position queries: token i sees
     * positions [win_start_i, win_start_i + win_len_i), all inside the
     * tile's union [p_lo, p_hi), whose cells are the tile's runs */
    const int64_t p_lo = tl.win_start, p_hi = tl.win_start + tl.win_len;
    if (p_lo < p_hi) {
        __syncthreads();
        for (int idx = tid; idx < rows * DH; idx += ATT_THREADS) {
            const int r = idx / DH, e = idx % DH, i = r / G, k = r % G;
            qb[idx] = a.q[((int64_t)(tl.first + i) * a.H + g * G + k) * DH + e];
        }
        for (int64_t p0 = p_lo; p0 < p_hi; p0 += PRE_KEYS) {
            const int nkt = (int)min64(PRE_KEYS, p_hi - p0);
            __syncthreads();
            for (int idx = tid; idx < nkt * DH; idx += ATT_THREADS) {
                const int j = idx / DH, e = idx % DH;
                const int64_t cell = run_cell(tl.run, p0 - p_lo + j);
                kf[j * (DH + 1) + e] = to_f32(K[cell * DH + e]);
                vf[j * DH + e] = to_f32(V[cell * DH + e]);
            }
            __syncthreads();
            prefill_fold<DH>(a, rows, nkt, qb, acc, kf, vf, s, m, l, corr, [&](int i, int j) {
                const cuda_tok &ti = a.tok[tl.first + i];
                const int64_t p = p0 + j;
                return p >= ti.win_start && p < ti.win_start + ti.win_len;
            });
        }
    }

    __syncthreads();
    const bool softpick = a.norm == MODEL_NORM_SOFTPICK;
    for (int idx = tid; idx < rows * DH; idx += ATT_THREADS) {
        const int r = idx / DH, e = idx % DH, i = r / G, k = r % G;
        const float L = l[r];
        float o = acc[idx];
        if (softpick)
            o /= L + SOFTPICK_EPS;
        else
            o = L > 0.0f ? o / L : 0.0f;
        const int64_t off = ((int64_t)(tl.first + i) * a.H + g * G + k) * DH + e;
        a.out[off] = o;
        a.out_h[off] = __float2half_rn(o);
    }
    if (tid < rows) {
        const int i = tid / G, k = tid % G;
        const int64_t so = ((int64_t)(tl.first + i) * a.H + g * G + k) * 2;
        a.stats[so] = m[tid];
        a.stats[so + 1] = l[tid];
    }
}

/* ---- probe: weights on the sequence's first positions ------------------------------------- */

template <typename KV, int DH>
__global__ void attention_probe_kernel(cuda_attn_args a, float *probe)
{
    const int t = blockIdx.x, h = blockIdx.y, rel = threadIdx.x;
    const int g = h / a.G;
    const cuda_tok tk = a.tok[t];
    const int64_t p = tk.pos_first + rel;
    int64_t cell = -1;
    const float *q = nullptr;
    const int64_t qo = ((int64_t)t * a.H + h) * DH;
    if (rel < tk.n_sinks) {
        cell = rel;
        q = a.qc + qo;
    } else if (p >= tk.win_start && p < tk.win_start + tk.win_len) {
        cell = run_cell(tk.run, tk.n_sinks + (p - tk.win_start));
        q = a.q + qo;
    }
    float w = 0.0f;
    if (cell >= 0) {
        const KV *K = static_cast<const KV *>(a.k) + tk.slot * a.geo.per_slot + a.geo.layer_off +
                      (int64_t)g * a.geo.per_head + cell * DH;
        float dot = 0.0f;
        for (int e = 0; e < DH; e++)
            dot += q[e] * to_f32(K[e]);
        const float zz = dot * a.scale;
        const float M = a.stats[((int64_t)t * a.H + h) * 2];
        const float L = a.stats[((int64_t)t * a.H + h) * 2 + 1];
        if (a.norm == MODEL_NORM_SOFTPICK) {
            const float dd = expf(zz - M) - expf(-M);
            w = dd > 0.0f ? dd / (L + SOFTPICK_EPS) : 0.0f;
        } else {
            w = L > 0.0f ? expf(zz - M) / L : 0.0f;
        }
    }
    probe[((int64_t)t * a.H + h) * BACKEND_PROBE_K + rel] = w;
}

#endif
