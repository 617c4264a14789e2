/*
 * cuda_emu.h: a CPU emulation of the CUDA execution model, enough to compile
 * and run engine/cuda/attention_kernels.cuh and elementwise_kernels.cuh with
 * g++ (C++17) on a machine without a GPU (tests/cuda_emu/test_*_emulated.cpp).
 *
 * Execution model
 * - emu_launch(grid, block, dyn_smem, f) runs f() once per CUDA thread of every
 *   block, with threadIdx / blockIdx / blockDim / gridDim set (thread_local).
 *   Blocks are spread over a few worker OS threads; inside a block every CUDA
 *   thread is a fiber (its own mmap'd stack with a guard page; switched by a
 *   few lines of assembly on x86-64, by ucontext elsewhere or with
 *   -DCUDA_EMU_UCONTEXT) and
 *   the worker schedules the block's fibers cooperatively: a fiber runs until
 *   it reaches __syncthreads(), a warp operation or its end. This is
 *   deterministic, fast with 128 threads per block on 2 cores, and a deadlock
 *   is detected at once (no fiber can run and no barrier can open) and
 *   reported with the file:line each thread waits at: no hang, no timeout.
 * - The order in which ready fibers run between two synchronization points is
 *   a schedule: forward (thread 0 first), reverse, or a seeded shuffle
 *   (cuda_emu::cfg().schedule). Any of them is a legal CUDA execution, so a
 *   race-free kernel gives bit-identical results under all of them; a missing
 *   __syncthreads() shows up as a difference (or as NaN: see below).
 * - __syncthreads(): every thread of the block must reach the same
 *   __syncthreads() (same file:line); a thread that exited or waits at
 *   another one is reported as divergent (undefined behaviour in CUDA).
 * - Warp operations (__shfl_*_sync, __syncwarp): warp w is the threads with
 *   linear id 32w .. 32w+31 (a block of 16 threads has one warp of 16 lanes).
 *   All non-exited lanes of the warp must take part, with the same mask, at
 *   the same call site; reading a lane that does not exist or has exited is
 *   reported. The value exchange happens when the whole warp has arrived.
 * - Dynamic shared memory (SS_DYNAMIC_SMEM, emu_dynamic_smem()) is a fresh,
 *   16-byte aligned buffer per block filled with 0xff bytes (NaN as float), so
 *   a read of shared memory nobody wrote poisons the result; a guard after it
 *   catches writes past the launch's size.
 * - Static shared memory (SS_STATIC_SMEM(T, name, n), the kernels' spelling of
 *   `__shared__ T name[n]`): each declaration gets its own buffer per block,
 *   NaN-filled at the start of every block and guarded like the dynamic one;
 *   at most 48 KiB per block (CUDA's static limit), and static plus dynamic
 *   within cfg().max_dyn_smem. `name` is a reference to an array of n T, so
 *   sizeof(name) is the same as in CUDA.
 * - Launch checks: block size <= 1024, grid.y/z <= 65535, dynamic shared
 *   memory <= cfg().max_dyn_smem (sm_80's opt-in limit by default).
 * - Vector types (uint4, float4, float2, __half2) check the alignment of every
 *   load and store made through them, as the GPU does (misaligned address).
 * - emu_watchdog(seconds): aborts the process with a message if it is still
 *   running after that long (a kernel that loops forever).
 *
 * Types: __half holds the IEEE binary16 bit pattern; conversions use
 * quant_f32_to_f16 / quant_f16_to_f32 (engine/quant.h), round to nearest even
 * like __float2half_rn. sizeof(__half) == 2, sizeof(__half2) == 4,
 * sizeof(uint4) == sizeof(float4) == 16, with CUDA's alignments.
 * rsqrtf(x) is 1.0f / sqrtf(x) (within 1 ulp of 1/sqrt(x); CUDA's is within
 * 2 ulp, so a kernel that uses it may differ from the GPU in the last bits).
 *
 * Include this before engine/cuda/kernel_args.cuh and the kernel headers.
 * Build with -fno-strict-aliasing (the kernels reinterpret __half rows as
 * uint4), -Wno-unknown-pragmas (#pragma unroll) and -pthread.
 */
#ifndef SS_CUDA_EMU_H
#define SS_CUDA_EMU_H

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef restrict
#define restrict __restrict__
#define CUDA_EMU_UNDEF_RESTRICT
#endif
extern "C" {
#include "quant.h" /* engine/quant.h: quant_f32_to_f16, quant_f16_to_f32 */
}
#ifdef CUDA_EMU_UNDEF_RESTRICT
#undef restrict
#undef CUDA_EMU_UNDEF_RESTRICT
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CUDA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_EMU_ASAN 1
#endif
#endif
#ifdef CUDA_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

/* ---- fiber switch ---------------------------------------------------------------------------- */

#if defined(__x86_64__) && !defined(CUDA_EMU_UCONTEXT)
#define CUDA_EMU_FAST_SWITCH 1
/* cuda_emu_switch(&save, to): pushes the callee-saved registers (SysV: rbp,
 * rbx, r12-r15, MXCSR and the x87 control word), stores the stack pointer in
 * *save, loads `to` and pops the same set from there. A new fiber's stack is
 * prepared so that the first switch "returns" into cuda_emu_entry, which
 * calls rbx(r12). No system call (swapcontext saves the signal mask). */
extern "C" void cuda_emu_switch(void **save, void *to);
extern "C" void cuda_emu_entry(void);
__asm__(".pushsection .text.cuda_emu_switch,\"axG\",@progbits,cuda_emu_switch,comdat\n"
        ".globl cuda_emu_switch\n.hidden cuda_emu_switch\n.type cuda_emu_switch,@function\n"
        "cuda_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size cuda_emu_switch, .-cuda_emu_switch\n"
        ".globl cuda_emu_entry\n.hidden cuda_emu_entry\n.type cuda_emu_entry,@function\n"
        "cuda_emu_entry:\n"
        "  movq %r12, %rdi\n  callq *%rbx\n  ud2\n"
        ".size cuda_emu_entry, .-cuda_emu_entry\n"
        ".popsection\n");
#endif

/* ---- qualifiers ------------------------------------------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
/* __restrict__ is g++'s own keyword. __shared__ itself is not emulated: a
 * kernel that spells static shared memory `__shared__ T name[n]` does not
 * compile; SS_STATIC_SMEM (below) does. */

/* ---- vector types ---------------------------------------------------------------------------- */

namespace cuda_emu
{
[[noreturn]] inline void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

inline void check_align(const void *p, size_t a, const char *type)
{
    if (((uintptr_t)p & (a - 1)) != 0)
        fatal("misaligned address: %s access at %p (needs %zu-byte alignment)", type, p, a);
}
} // namespace cuda_emu

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_)
    {
    }
};

struct __half {
    uint16_t x; /* the bit pattern */
};

/* The vector types are may_alias (kernels reinterpret rows of one type as
 * another) and check their alignment on every copy, like a GPU vector load. */
#define CUDA_EMU_VECTOR(T, ALIGN, ...)                                                             \
    struct __attribute__((may_alias, aligned(ALIGN))) T {                                          \
        __VA_ARGS__;                                                                               \
        T() = default;                                                                             \
        T(const T &o)                                                                              \
        {                                                                                          \
            cuda_emu::check_align(&o, ALIGN, #T " load");                                          \
            memcpy((void *)this, (const void *)&o, sizeof(T));                                     \
        }                                                                                          \
        T &operator=(const T &o)                                                                   \
        {                                                                                          \
            cuda_emu::check_align(this, ALIGN, #T " store");                                       \
            cuda_emu::check_align(&o, ALIGN, #T " load");                                          \
            memcpy((void *)this, (const void *)&o, sizeof(T));                                     \
            return *this;                                                                          \
        }                                                                                          \
    }

CUDA_EMU_VECTOR(__half2, 4, __half x; __half y);
CUDA_EMU_VECTOR(float2, 8, float x; float y);
CUDA_EMU_VECTOR(float4, 16, float x; float y; float z; float w);
CUDA_EMU_VECTOR(uint4, 16, unsigned x; unsigned y; unsigned z; unsigned w);
#undef CUDA_EMU_VECTOR

static_assert(sizeof(__half) == 2 && alignof(__half) == 2, "__half layout");
static_assert(sizeof(__half2) == 4 && alignof(__half2) == 4, "__half2 layout");
static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "float2 layout");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "float4 layout");
static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16, "uint4 layout");
static_assert(std::is_trivially_copyable<__half>::value, "__half is plain bits");

inline float2 make_float2(float x, float y)
{
    float2 r;
    r.x = x;
    r.y = y;
    return r;
}
inline float4 make_float4(float x, float y, float z, float w)
{
    float4 r;
    r.x = x;
    r.y = y;
    r.z = z;
    r.w = w;
    return r;
}

/* ---- half conversions (round to nearest even) ------------------------------------------------ */

inline __half __float2half_rn(float f)
{
    __half h;
    h.x = quant_f32_to_f16(f);
    return h;
}
inline __half __float2half(float f)
{
    return __float2half_rn(f);
}
inline float __half2float(__half h)
{
    return quant_f16_to_f32(h.x);
}
inline float2 __half22float2(__half2 v)
{
    return make_float2(__half2float(v.x), __half2float(v.y));
}
inline __half2 __floats2half2_rn(float a, float b)
{
    __half2 r;
    r.x = __float2half_rn(a);
    r.y = __float2half_rn(b);
    return r;
}
inline __half2 __float22half2_rn(float2 f)
{
    return __floats2half2_rn(f.x, f.y);
}

/* ---- built-in variables ---------------------------------------------------------------------- */

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
static constexpr int warpSize = 32;

/* ---- the emulator ---------------------------------------------------------------------------- */

namespace cuda_emu
{

enum schedule_kind { SCHED_FORWARD = 0, SCHED_REVERSE = 1, SCHED_SHUFFLE = 2 };

struct config {
    int schedule = SCHED_FORWARD;
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* for SCHED_SHUFFLE */
    int workers = 0;                       /* OS threads running blocks; 0: min(cores, 4) */
    size_t max_dyn_smem = 166912;          /* bytes: sm_80's opt-in maximum (163 KiB) */
    size_t stack_bytes = 0;                /* per CUDA thread; 0: 256 KiB (1 MiB under ASan) */
};
inline config &cfg()
{
    static config c;
    return c;
}

inline const char *schedule_name(int s)
{
    return s == SCHED_FORWARD ? "forward" : s == SCHED_REVERSE ? "reverse" : "shuffle";
}

/* What is running, for fatal() and the watchdog (set by emu_launch). */
inline std::atomic<const char *> g_kernel{"(no kernel)"};
inline thread_local bool tl_in_block = false;  /* fatal() names the block */
inline thread_local bool tl_in_thread = false; /* ... and threadIdx */

inline void fatal(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tl_in_block && tl_in_thread)
        fprintf(stderr, "cuda_emu: FATAL in %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n",
                g_kernel.load(), blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                threadIdx.z, msg);
    else if (tl_in_block)
        fprintf(stderr, "cuda_emu: FATAL in %s, block (%u,%u,%u): %s\n", g_kernel.load(),
                blockIdx.x, blockIdx.y, blockIdx.z, msg);
    else
        fprintf(stderr, "cuda_emu: FATAL (%s): %s\n", g_kernel.load(), msg);
    fflush(stderr);
    abort();
}

enum : uint8_t { ST_READY, ST_SYNC, ST_WARP, ST_DONE };
enum : uint8_t { WOP_SYNCWARP, WOP_SHFL };

struct fiber {
#ifdef CUDA_EMU_FAST_SWITCH
    void *sp; /* saved stack pointer */
#else
    ucontext_t ctx;
#endif
    uint3 tid;
    int lin;
    uint8_t st;
    uint8_t wop;
    const char *file; /* call site of the pending synchronization */
    int line;
    uint32_t mask;
    int src; /* shuffle: source lane */
    uint64_t val, res;
};

struct stack_mem {
    void *base = nullptr; /* mapping: guard page, then the stack */
    size_t total = 0;
    void *lo() const
    {
        return (char *)base + page();
    }
    size_t size() const
    {
        return total - page();
    }
    static size_t page()
    {
        return (size_t)sysconf(_SC_PAGESIZE);
    }
};

/* Fiber stacks are kept for the next launch (mapping and first-touching them
 * costs more than most blocks). */
struct stack_pool {
    std::mutex mu;
    std::vector<stack_mem> avail;
    ~stack_pool()
    {
        for (auto &s : avail)
            munmap(s.base, s.total);
    }
};
inline stack_pool &stacks()
{
    static stack_pool p;
    return p;
}

inline stack_mem stack_get(size_t total)
{
    {
        std::lock_guard<std::mutex> lk(stacks().mu);
        auto &fr = stacks().avail;
        for (size_t i = fr.size(); i-- > 0;)
            if (fr[i].total == total) {
                stack_mem s = fr[i];
                fr[i] = fr.back();
                fr.pop_back();
                return s;
            }
    }
    const size_t pg = stack_mem::page();
    stack_mem s;
    s.total = total;
    s.base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s.base == MAP_FAILED)
        fatal("mmap of a %zu-byte fiber stack failed", total);
    if (mprotect(s.base, pg, PROT_NONE) != 0) /* guard page: an overflow faults */
        fatal("mprotect of a guard page failed");
    return s;
}

inline void stack_put(const stack_mem &s)
{
    std::lock_guard<std::mutex> lk(stacks().mu);
    stacks().avail.push_back(s);
}

/* One worker: runs blocks, one at a time, as fibers. */
struct runner {
    void (*body)(void *) = nullptr;
    void *arg = nullptr;
    int n = 0; /* threads per block */
    std::unique_ptr<fiber[]> f;
    std::vector<stack_mem> stacks;
#ifdef CUDA_EMU_FAST_SWITCH
    void *sched_sp = nullptr;
#else
    ucontext_t sched;
#endif
    fiber *cur = nullptr;
    unsigned char *smem_raw = nullptr;
    unsigned char *smem = nullptr;
    size_t smem_bytes = 0;
    struct static_array { /* one SS_STATIC_SMEM declaration */
        const void *tag;
        size_t bytes;
        unsigned char *mem; /* bytes, then SMEM_GUARD guard bytes */
        const char *file;
        int line;
    };
    std::vector<static_array> statics;
    size_t static_bytes = 0;
#ifdef CUDA_EMU_ASAN
    const void *sched_lo = nullptr;
    size_t sched_size = 0;
#endif
    ~runner()
    {
        for (auto &s : stacks)
            if (s.base)
                stack_put(s);
        free(smem_raw);
        for (auto &a : statics)
            free(a.mem);
    }
};

inline thread_local runner *tl_run = nullptr;
inline thread_local unsigned char *tl_smem = nullptr;

constexpr size_t SMEM_GUARD = 256;
constexpr unsigned char SMEM_FILL = 0xff; /* NaN as f32, NaN as f16 */
constexpr unsigned char GUARD_FILL = 0xa5;
constexpr size_t MAX_STATIC_SMEM = 48u << 10; /* CUDA's limit on static shared memory */

inline uint64_t splitmix(uint64_t &s)
{
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- fiber switching ------------------------------------------------------------------------- */

inline void fiber_main();

/* Fiber -> scheduler. The fiber's state must be set before. */
inline void to_scheduler(runner *r, bool exiting)
{
    fiber *me = r->cur;
#ifdef CUDA_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, r->sched_lo, r->sched_size);
#endif
#ifdef CUDA_EMU_FAST_SWITCH
    cuda_emu_switch(&me->sp, r->sched_sp);
    if (exiting)
        fatal("an exited fiber was resumed");
#else
    if (exiting) {
        setcontext(&r->sched);
        fatal("setcontext failed");
    }
    if (swapcontext(&me->ctx, &r->sched) != 0)
        fatal("swapcontext failed");
#endif
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &r->sched_lo, &r->sched_size);
#endif
}

/* Scheduler -> fiber i, until it yields. */
inline void resume(runner *r, int i, const stack_mem &st)
{
    fiber *fb = &r->f[i];
    threadIdx = fb->tid;
    r->cur = fb;
    tl_in_thread = true;
#ifdef CUDA_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, st.lo(), st.size());
#else
    (void)st;
#endif
#ifdef CUDA_EMU_FAST_SWITCH
    cuda_emu_switch(&r->sched_sp, fb->sp);
#else
    if (swapcontext(&r->sched, &fb->ctx) != 0)
        fatal("swapcontext failed");
#endif
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    tl_in_thread = false;
}

inline void fiber_main()
{
    runner *r = tl_run;
#ifdef CUDA_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r->sched_lo, &r->sched_size);
#endif
    r->body(r->arg);
    r->cur->st = ST_DONE;
    to_scheduler(r, true);
}

#ifdef CUDA_EMU_FAST_SWITCH
inline void fiber_start(void *)
{
    fiber_main();
}
#endif

inline runner *current(const char *what)
{
    runner *r = tl_run;
    if (!r || !r->cur)
        fatal("%s called outside a kernel launch", what);
    return r;
}

/* ---- synchronization ------------------------------------------------------------------------- */

inline void syncthreads_at(const char *file, int line)
{
    runner *r = current("__syncthreads");
    r->cur->file = file;
    r->cur->line = line;
    r->cur->st = ST_SYNC;
    to_scheduler(r, false);
}

inline uint64_t warp_op(const char *file, int line, uint8_t wop, uint32_t mask, int src,
                        uint64_t val)
{
    runner *r = current("a warp operation");
    fiber *me = r->cur;
    const int lane = me->lin & 31;
    if (!(mask >> lane & 1u))
        fatal("%s:%d: warp operation with mask 0x%08x that excludes the calling lane %d", file,
              line, mask, lane);
    if (wop == WOP_SHFL && (src < 0 || src > 31))
        fatal("%s:%d: shuffle source lane %d out of range", file, line, src);
    me->file = file;
    me->line = line;
    me->wop = wop;
    me->mask = mask;
    me->src = src;
    me->val = val;
    me->st = ST_WARP;
    to_scheduler(r, false);
    return r->cur->res;
}

inline int lane_id()
{
    return current("lane_id")->cur->lin & 31;
}

template <typename T> inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T> inline T from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* CUDA's width rule: lanes are split into groups of `width`; a source lane in
 * a later group gives the caller its own value. */
inline int shfl_src_in_width(int lane, int src, int width, const char *file, int line)
{
    if (width < 1 || width > 32 || (width & (width - 1)))
        fatal("%s:%d: shuffle width %d is not a power of two <= 32", file, line, width);
    const int seg = lane & ~(width - 1);
    return src >= seg + width ? lane : src;
}

template <typename T>
inline T shfl_xor_at(const char *file, int line, unsigned mask, T v, int lane_mask, int width = 32)
{
    const int lane = lane_id();
    const int src = shfl_src_in_width(lane, lane ^ lane_mask, width, file, line);
    return from_bits<T>(warp_op(file, line, WOP_SHFL, mask, src, to_bits(v)));
}
template <typename T>
inline T shfl_at(const char *file, int line, unsigned mask, T v, int src_lane, int width = 32)
{
    const int lane = lane_id();
    if (width < 1 || width > 32 || (width & (width - 1)))
        fatal("%s:%d: shuffle width %d is not a power of two <= 32", file, line, width);
    const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
    return from_bits<T>(warp_op(file, line, WOP_SHFL, mask, src, to_bits(v)));
}
template <typename T>
inline T shfl_down_at(const char *file, int line, unsigned mask, T v, unsigned delta,
                      int width = 32)
{
    const int lane = lane_id();
    const int src = shfl_src_in_width(lane, lane + (int)delta, width, file, line);
    return from_bits<T>(warp_op(file, line, WOP_SHFL, mask, src > 31 ? lane : src, to_bits(v)));
}
template <typename T>
inline T shfl_up_at(const char *file, int line, unsigned mask, T v, unsigned delta, int width = 32)
{
    const int lane = lane_id();
    const int seg = lane & ~(width - 1);
    const int src = lane - (int)delta < seg ? lane : lane - (int)delta;
    return from_bits<T>(warp_op(file, line, WOP_SHFL, mask, src, to_bits(v)));
}

inline void syncwarp_at(const char *file, int line, unsigned mask)
{
    (void)warp_op(file, line, WOP_SYNCWARP, mask, 0, 0);
}

/* The block's buffer for the SS_STATIC_SMEM declaration `tag` (the address of
 * a static object unique to the declaration): allocated (NaN-filled) the first
 * time a thread of this worker reaches the declaration, refilled at the start
 * of every later block. */
inline void *static_smem(const void *tag, size_t bytes, size_t align, const char *file, int line)
{
    runner *r = current("static shared memory");
    for (const auto &a : r->statics)
        if (a.tag == tag)
            return a.mem;
    if (align > 16)
        fatal("%s:%d: static shared memory aligned to %zu bytes (not emulated)", file, line, align);
    if (r->static_bytes + bytes > MAX_STATIC_SMEM)
        fatal("%s:%d: %zu bytes of static shared memory per block (the device allows %zu)", file,
              line, r->static_bytes + bytes, MAX_STATIC_SMEM);
    if (r->static_bytes + bytes + r->smem_bytes > cfg().max_dyn_smem)
        fatal("%s:%d: %zu bytes of static and %zu of dynamic shared memory (the device allows "
              "%zu in all)",
              file, line, r->static_bytes + bytes, r->smem_bytes, cfg().max_dyn_smem);
    runner::static_array a;
    a.tag = tag;
    a.bytes = bytes;
    a.file = file;
    a.line = line;
    a.mem = (unsigned char *)aligned_alloc(16, (bytes + SMEM_GUARD + 15) / 16 * 16);
    if (!a.mem)
        fatal("out of memory for %zu bytes of static shared memory", bytes);
    memset(a.mem, SMEM_FILL, bytes);
    memset(a.mem + bytes, GUARD_FILL, SMEM_GUARD);
    r->statics.push_back(a);
    r->static_bytes += bytes;
    return a.mem;
}

/* ---- the block scheduler --------------------------------------------------------------------- */

inline const char *state_name(uint8_t s)
{
    return s == ST_READY  ? "running"
           : s == ST_SYNC ? "__syncthreads"
           : s == ST_WARP ? "warp op"
                          : "exited";
}

[[noreturn]] inline void report_stuck(runner *r, const char *why)
{
    fprintf(stderr, "cuda_emu: %s in %s, block (%u,%u,%u) of %d threads:\n", why, g_kernel.load(),
            blockIdx.x, blockIdx.y, blockIdx.z, r->n);
    /* group consecutive threads in the same state at the same site */
    for (int i = 0; i < r->n;) {
        int j = i + 1;
        const fiber &a = r->f[i];
        while (j < r->n && r->f[j].st == a.st &&
               (a.st == ST_DONE || (r->f[j].file == a.file && r->f[j].line == a.line)))
            j++;
        if (a.st == ST_DONE)
            fprintf(stderr, "  threads %d..%d: exited\n", i, j - 1);
        else
            fprintf(stderr, "  threads %d..%d: at %s (%s:%d)\n", i, j - 1, state_name(a.st),
                    a.file ? a.file : "?", a.line);
        i = j;
    }
    fflush(stderr);
    tl_in_block = false; /* the message above already names the block */
    fatal("%s", why);
}

/* Releases warp w if all its non-exited lanes wait at the same warp op. */
inline bool try_release_warp(runner *r, int w)
{
    const int l0 = w * 32, ln = std::min(r->n, l0 + 32), ws = ln - l0;
    int waiting = 0, done = 0;
    const fiber *first = nullptr;
    for (int i = l0; i < ln; i++) {
        const fiber &x = r->f[i];
        if (x.st == ST_WARP) {
            waiting++;
            if (!first)
                first = &x;
        } else if (x.st == ST_DONE) {
            done++;
        }
    }
    if (waiting == 0 || waiting + done != ws)
        return false; /* nobody waits, or some lane is elsewhere (a deadlock, reported later) */
    const uint32_t lanes = ws == 32 ? 0xffffffffu : ((1u << ws) - 1);
    for (int i = l0; i < ln; i++) {
        const fiber &x = r->f[i];
        if (x.st != ST_WARP)
            continue;
        if (x.file != first->file || x.line != first->line || x.wop != first->wop)
            report_stuck(r, "warp divergence: lanes of one warp wait at different warp "
                            "operations");
        if (x.mask != first->mask)
            report_stuck(r, "lanes of one warp pass different masks");
        if ((x.mask & lanes) != lanes) {
            /* a partial mask: every existing lane left out must have exited */
            for (int k = 0; k < ws; k++)
                if (!(x.mask >> k & 1u) && r->f[l0 + k].st != ST_DONE)
                    report_stuck(r, "warp operation with a partial mask (not emulated)");
        }
    }
    for (int i = l0; i < ln; i++) {
        fiber &x = r->f[i];
        if (x.st != ST_WARP)
            continue;
        if (x.wop == WOP_SHFL) {
            if (x.src >= ws) {
                threadIdx = x.tid;
                tl_in_thread = true;
                fatal("%s:%d: shuffle reads lane %d of a warp of %d lanes", x.file, x.line, x.src,
                      ws);
            }
            const fiber &s = r->f[l0 + x.src];
            if (s.st != ST_WARP) {
                threadIdx = x.tid;
                tl_in_thread = true;
                fatal("%s:%d: shuffle reads lane %d, which has exited", x.file, x.line, x.src);
            }
            x.res = s.val;
        }
    }
    for (int i = l0; i < ln; i++)
        if (r->f[i].st == ST_WARP)
            r->f[i].st = ST_READY;
    return true;
}

inline void run_block(runner *r, uint3 b, uint64_t block_lin)
{
    blockIdx = b;
    tl_in_block = true;
    const int n = r->n;
    if (r->smem_bytes) {
        memset(r->smem, SMEM_FILL, r->smem_bytes);
        memset(r->smem + r->smem_bytes, GUARD_FILL, SMEM_GUARD);
    }
    for (auto &a : r->statics) {
        memset(a.mem, SMEM_FILL, a.bytes);
        memset(a.mem + a.bytes, GUARD_FILL, SMEM_GUARD);
    }
    tl_smem = r->smem_bytes ? r->smem : nullptr;
#ifdef CUDA_EMU_FAST_SWITCH
    const uint32_t mxcsr = __builtin_ia32_stmxcsr();
    uint16_t x87cw;
    __asm__ volatile("fnstcw %0" : "=m"(x87cw));
#endif
    for (int i = 0; i < n; i++) {
        fiber &x = r->f[i];
        x.lin = i;
        x.tid.x = (unsigned)i % blockDim.x;
        x.tid.y = (unsigned)i / blockDim.x % blockDim.y;
        x.tid.z = (unsigned)i / (blockDim.x * blockDim.y);
        x.st = ST_READY;
        x.file = nullptr;
        x.line = 0;
#ifdef CUDA_EMU_FAST_SWITCH
        /* the frame cuda_emu_switch pops: MXCSR + x87 CW, r15, r14, r13,
         * r12 (arg), rbx (function), rbp (0: ends frame-pointer walks), and
         * the return address; cuda_emu_entry starts with a 16-byte aligned rsp */
        uintptr_t top = ((uintptr_t)r->stacks[i].lo() + r->stacks[i].size()) & ~(uintptr_t)15;
        uint64_t *sp = (uint64_t *)(top - 8);
        *sp = (uint64_t)(uintptr_t)cuda_emu_entry;
        *--sp = 0;                                /* rbp */
        *--sp = (uint64_t)(uintptr_t)fiber_start; /* rbx */
        *--sp = 0;                                /* r12: fiber_start's argument */
        *--sp = 0;                                /* r13 */
        *--sp = 0;                                /* r14 */
        *--sp = 0;                                /* r15 */
        *--sp = mxcsr | (uint64_t)x87cw << 32;    /* as the scheduler's */
        x.sp = sp;
#else
        if (getcontext(&x.ctx) != 0)
            fatal("getcontext failed");
        x.ctx.uc_stack.ss_sp = r->stacks[i].lo();
        x.ctx.uc_stack.ss_size = r->stacks[i].size();
        x.ctx.uc_link = &r->sched;
        makecontext(&x.ctx, fiber_main, 0);
#endif
    }
    uint64_t rng = cfg().seed ^ (block_lin * 0xd1342543de82ef95ull);
    std::vector<int> order;
    order.reserve(n);
    for (;;) {
        order.clear();
        for (int i = 0; i < n; i++)
            if (r->f[i].st == ST_READY)
                order.push_back(i);
        if (!order.empty()) {
            if (cfg().schedule == SCHED_REVERSE) {
                std::reverse(order.begin(), order.end());
            } else if (cfg().schedule == SCHED_SHUFFLE) {
                for (size_t i = order.size(); i > 1; i--)
                    std::swap(order[i - 1], order[splitmix(rng) % i]);
            }
            for (int i : order)
                resume(r, i, r->stacks[i]);
            continue;
        }
        bool progress = false;
        for (int w = 0; w * 32 < n; w++)
            progress |= try_release_warp(r, w);
        if (progress)
            continue;
        int n_done = 0, n_sync = 0;
        for (int i = 0; i < n; i++) {
            n_done += r->f[i].st == ST_DONE;
            n_sync += r->f[i].st == ST_SYNC;
        }
        if (n_done == n)
            break;
        if (n_sync == n) {
            for (int i = 1; i < n; i++)
                if (r->f[i].file != r->f[0].file || r->f[i].line != r->f[0].line)
                    report_stuck(r, "threads of one block wait at different __syncthreads()");
            for (int i = 0; i < n; i++)
                r->f[i].st = ST_READY;
            continue;
        }
        if (n_sync > 0 && n_done > 0 && n_sync + n_done == n)
            report_stuck(r, "__syncthreads() not reached by every thread (some exited)");
        report_stuck(r, "DEADLOCK");
    }
    r->cur = nullptr;
    if (r->smem_bytes) {
        for (size_t i = 0; i < SMEM_GUARD; i++)
            if (r->smem[r->smem_bytes + i] != GUARD_FILL)
                fatal("write past the end of dynamic shared memory (%zu bytes) at byte %zu",
                      r->smem_bytes, r->smem_bytes + i);
    }
    for (const auto &a : r->statics)
        for (size_t i = 0; i < SMEM_GUARD; i++)
            if (a.mem[a.bytes + i] != GUARD_FILL)
                fatal("write past the end of the static shared array declared at %s:%d (%zu "
                      "bytes) at byte %zu",
                      a.file, a.line, a.bytes, a.bytes + i);
    tl_smem = nullptr;
    tl_in_block = false;
}

inline void setup_runner(runner *r, int n, size_t smem_bytes)
{
    r->n = n;
    r->f.reset(new fiber[n]);
    size_t want = cfg().stack_bytes;
    if (!want) {
#ifdef CUDA_EMU_ASAN
        want = 1u << 20;
#else
        want = 256u << 10;
#endif
    }
    const size_t pg = stack_mem::page();
    want = (want + pg - 1) / pg * pg;
    r->stacks.resize(n);
    for (auto &s : r->stacks)
        s = stack_get(want + pg);
    r->smem_bytes = smem_bytes;
    if (smem_bytes) {
        r->smem_raw = (unsigned char *)aligned_alloc(16, (smem_bytes + SMEM_GUARD + 15) / 16 * 16);
        if (!r->smem_raw)
            fatal("out of memory for %zu bytes of shared memory", smem_bytes);
        r->smem = r->smem_raw;
    }
}

/* Runs blocks next.. of the grid on this OS thread. */
inline void worker(void (*body)(void *), void *arg, dim3 grid, dim3 block, size_t smem,
                   std::atomic<uint64_t> *next, uint64_t n_blocks)
{
    runner r;
    r.body = body;
    r.arg = arg;
    setup_runner(&r, (int)(block.x * block.y * block.z), smem);
    tl_run = &r;
    blockDim = block;
    gridDim = grid;
    for (;;) {
        const uint64_t i = next->fetch_add(1);
        if (i >= n_blocks)
            break;
        uint3 b;
        b.x = (unsigned)(i % grid.x);
        b.y = (unsigned)(i / grid.x % grid.y);
        b.z = (unsigned)(i / ((uint64_t)grid.x * grid.y));
        run_block(&r, b, i);
    }
    tl_run = nullptr;
}

inline void watchdog_handler(int)
{
    static const char m1[] = "\ncuda_emu: WATCHDOG: time limit reached (a kernel that never "
                             "finishes?); running: ";
    static const char m2[] = "\n";
    ssize_t rc = write(2, m1, sizeof m1 - 1);
    const char *k = g_kernel.load();
    rc = write(2, k, strlen(k));
    rc = write(2, m2, 1);
    (void)rc;
    abort();
}

} // namespace cuda_emu

/* ---- public interface ------------------------------------------------------------------------ */

#define __syncthreads() ::cuda_emu::syncthreads_at(__FILE__, __LINE__)
#define __shfl_xor_sync(...) ::cuda_emu::shfl_xor_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_sync(...) ::cuda_emu::shfl_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::cuda_emu::shfl_down_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::cuda_emu::shfl_up_at(__FILE__, __LINE__, __VA_ARGS__)
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    ::cuda_emu::syncwarp_at("(__syncwarp)", 0, mask);
}
inline void __threadfence_block()
{
}
inline void __threadfence()
{
}
template <typename T> inline T __ldg(const T *p)
{
    return *p;
}

/* The block's dynamic shared memory (the launch's dyn_smem bytes, NaN-filled). */
inline void *emu_dynamic_smem()
{
    if (!::cuda_emu::tl_smem)
        ::cuda_emu::fatal("dynamic shared memory used by a launch that has none");
    return ::cuda_emu::tl_smem;
}
#ifndef SS_DYNAMIC_SMEM
#define SS_DYNAMIC_SMEM(T, name) T *name = reinterpret_cast<T *>(emu_dynamic_smem())
#endif
/* `__shared__ T name[n]`: the block's own n T (NaN-filled), as a T (&)[n]. */
#ifndef SS_STATIC_SMEM
#define SS_STATIC_SMEM(T, name, n)                                                                 \
    static char name##_cuda_emu_tag;                                                               \
    T(&name)                                                                                       \
    [n] = *reinterpret_cast<T(*)[n]>(::cuda_emu::static_smem(&name##_cuda_emu_tag, sizeof(T[n]),   \
                                                             alignof(T), __FILE__, __LINE__))
#endif

/* CUDA's fast reciprocal square root (see the header comment). */
namespace cuda_emu
{
inline float rsqrt_f(float x)
{
    return 1.0f / sqrtf(x);
}
} // namespace cuda_emu
#define rsqrtf(x) ::cuda_emu::rsqrt_f(x)

/* Runs kernel() for every thread of a grid<<<grid, block, dyn_smem>>> and
 * returns when all blocks are done (like a launch plus a synchronize). */
template <typename F>
inline void emu_launch(dim3 grid, dim3 block, size_t dyn_smem, F &&kernel,
                       const char *name = "kernel")
{
    using namespace cuda_emu;
    g_kernel.store(name);
    const uint64_t nt = (uint64_t)block.x * block.y * block.z;
    if (nt < 1 || nt > 1024 || block.z > 64)
        fatal("invalid block (%u,%u,%u)", block.x, block.y, block.z);
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 ||
        grid.x > 0x7fffffffu)
        fatal("invalid grid (%u,%u,%u)", grid.x, grid.y, grid.z);
    if (dyn_smem > cfg().max_dyn_smem)
        fatal("%zu bytes of dynamic shared memory (the device allows %zu)", dyn_smem,
              cfg().max_dyn_smem);
    const uint64_t n_blocks = (uint64_t)grid.x * grid.y * grid.z;
    using Fn = typename std::remove_reference<F>::type;
    Fn *fp = &kernel;
    void (*body)(void *) = [](void *p) { (*static_cast<Fn *>(p))(); };
    int nw = cfg().workers;
    if (nw <= 0) {
        nw = (int)std::thread::hardware_concurrency();
        nw = nw < 1 ? 1 : nw > 4 ? 4 : nw;
    }
    if ((uint64_t)nw > n_blocks)
        nw = (int)n_blocks;
    std::atomic<uint64_t> next{0};
    if (nw <= 1) {
        worker(body, (void *)fp, grid, block, dyn_smem, &next, n_blocks);
    } else {
        std::vector<std::thread> th;
        for (int i = 0; i < nw; i++)
            th.emplace_back(worker, body, (void *)fp, grid, block, dyn_smem, &next, n_blocks);
        for (auto &t : th)
            t.join();
    }
    g_kernel.store("(no kernel)");
}

/* Aborts the process with a message after `seconds` (0 disarms). */
inline void emu_watchdog(unsigned seconds)
{
    signal(SIGALRM, ::cuda_emu::watchdog_handler);
    alarm(seconds);
}

#endif
