/*
 * The CUDA emulation's launcher: each GPU thread of a block is a fiber on the
 * calling host thread, blocks run one after another. A fiber runs until it
 * yields at __syncthreads (a block barrier) or a warp shuffle/vote (a warp
 * barrier), or returns; the scheduler then picks the next runnable fiber in
 * the order IG_CUDA_EMU_ORDER names:
 *   forward     lowest thread first (the default);
 *   reverse     highest thread first, blocks in reverse too;
 *   random[:S]  a seeded shuffle each time fibers are released;
 *   ahead[:W]   warp W (default: the last) runs as far as it can, through
 *               its own shuffles, before any other thread runs.
 * A barrier no live thread can leave (a shuffle in divergent code, a
 * __syncthreads some threads skip while others wait) is a deadlock and
 * aborts with the kernel's name.
 */
#include "cuda_runtime.h"
#include "emu_internal.h"

#include <algorithm>
#include <random>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define IG_EMU_ASAN 1
#else
#define IG_EMU_ASAN 0
#endif
/* The scheduler's own bookkeeping runs hundreds of millions of times in a
 * test and is not what ASan is there to check: the kernels are. */
#define IG_EMU_HOT __attribute__((no_sanitize("address", "undefined")))

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace ig_emu {

uint3 block_idx;
dim3 block_dim, grid_dim;
thread_s *volatile current;

namespace {

/* ---- context switch ------------------------------------------------------ */

#if defined(__x86_64__)
/* Saves the callee-saved registers on the current stack, stores the stack
 * pointer in *save and resumes the context whose stack pointer is `to`. */
extern "C" void ig_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl ig_emu_switch\n"
        ".type ig_emu_switch,@function\n"
        "ig_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ig_emu_switch, .-ig_emu_switch\n");
#endif

enum { RUN, WAIT_BLOCK, WAIT_WARP, DONE };
enum { ORDER_FORWARD, ORDER_REVERSE, ORDER_RANDOM, ORDER_AHEAD };

const size_t STACK_BYTES = IG_EMU_ASAN ? 512 * 1024 : 256 * 1024;

struct fiber_s : thread_s {
    int state;
    int tid;
    unsigned nxchg; /* warp exchanges done */
    void *stack;   /* the mapping, a guard page first */
    char *lo, *hi; /* usable stack */
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
    void *asan_fake;
};

struct warp_s {
    int live, waiting;
};

struct {
    /* Grown to the largest block and kept for the process (a plain array:
     * no destructor at exit leaves them unreachable for LeakSanitizer). */
    fiber_s *fibers[1024];
    int nfibers;
    std::vector<warp_s> warps;
    /* Two slots per thread for warp exchanges, used alternately: a lane can
     * deposit for its next exchange while a slower one still reads this one,
     * never two ahead (the next exchange's barrier waits for every lane). */
    std::vector<uint64_t> xchg[2];
    std::vector<unsigned> xseq[2]; /* which exchange of its lane each slot holds */
    std::vector<int> queue;     /* runnable fibers, next first */
    size_t qhead;
    int nthreads, live, waiting_block;
    void (*body)(void *);
    void *ctx;
    const char *name;
    unsigned char *smem;
    size_t smem_bytes;
#if defined(__x86_64__)
    void *sched_sp;
#else
    ucontext_t sched_uc;
#endif
    const void *sched_bottom;
    size_t sched_size;
    void *sched_fake;
    bool from_sched; /* the fiber being entered comes from the scheduler */
    int order, ahead_warp;
    unsigned long long seed;
    std::mt19937_64 rng;
    char order_name[64];
    bool configured;
} S;

void configure()
{
    if (S.configured)
        return;
    S.configured = true;
    const char *o = getenv("IG_CUDA_EMU_ORDER");
    S.order = ORDER_FORWARD;
    S.ahead_warp = -1;
    S.seed = 1;
    if (o && strncmp(o, "reverse", 7) == 0) {
        S.order = ORDER_REVERSE;
    } else if (o && strncmp(o, "random", 6) == 0) {
        S.order = ORDER_RANDOM;
        if (o[6] == ':')
            S.seed = strtoull(o + 7, NULL, 10);
    } else if (o && strncmp(o, "ahead", 5) == 0) {
        S.order = ORDER_AHEAD;
        if (o[5] == ':')
            S.ahead_warp = atoi(o + 6);
    } else if (o && *o && strcmp(o, "forward") != 0) {
        fprintf(stderr, "cuda-emu: IG_CUDA_EMU_ORDER=%s is not forward, reverse, random[:SEED] "
                        "or ahead[:WARP]\n", o);
        abort();
    }
    S.rng.seed(S.seed);
    switch (S.order) {
    case ORDER_REVERSE:
        snprintf(S.order_name, sizeof(S.order_name), "reverse");
        break;
    case ORDER_RANDOM:
        snprintf(S.order_name, sizeof(S.order_name), "random:%llu", S.seed);
        break;
    case ORDER_AHEAD:
        if (S.ahead_warp >= 0)
            snprintf(S.order_name, sizeof(S.order_name), "ahead:%d", S.ahead_warp);
        else
            snprintf(S.order_name, sizeof(S.order_name), "ahead");
        break;
    default:
        snprintf(S.order_name, sizeof(S.order_name), "forward");
    }
}

int ahead_warp()
{
    int nw = (S.nthreads + 31) / 32;
    int w = S.ahead_warp >= 0 ? S.ahead_warp : nw - 1;
    return w < nw ? w : nw - 1;
}

/* ---- fibers ---------------------------------------------------------------- */

void fiber_main();
IG_EMU_HOT void enter(fiber_s *f);

fiber_s *fiber_get(int tid)
{
    while (S.nfibers <= tid) {
        fiber_s *f = new fiber_s();
        long page = 4096;
        void *m = mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cuda-emu: no memory for a fiber stack\n");
            abort();
        }
        mprotect(m, page, PROT_NONE); /* a stack overflow faults */
        f->stack = m;
        f->lo = (char *)m + page;
        f->hi = f->lo + STACK_BYTES;
        S.fibers[S.nfibers++] = f;
    }
    return S.fibers[tid];
}

void fiber_reset(fiber_s *f)
{
#if IG_EMU_ASAN
    /* The frames live when the fiber's previous run ended (fiber_main and
     * the switch out) never returned: clear their poison. Every deeper frame
     * returned before that and cleared its own. */
    const size_t top_bytes = 32 * 1024;
    ASAN_UNPOISON_MEMORY_REGION(f->hi - top_bytes, top_bytes);
#endif
    f->asan_fake = NULL;
#if defined(__x86_64__)
    /* The frame ig_emu_switch pops: six registers, then fiber_main as the
     * return address, with the stack aligned as after a call. */
    /* Tops staggered by thread: stacks a multiple of the page apart would
     * all use the same cache sets. */
    uintptr_t top = ((uintptr_t)f->hi - (uintptr_t)(f->tid % 61) * 64) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = NULL;
    sp[6] = (void *)&fiber_main;
    sp[7] = NULL;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->lo;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_main, 0);
#endif
}

/* ---- scheduling ---------------------------------------------------------- */

/* Queues fibers [ids] in the policy's order. */
IG_EMU_HOT void release(std::vector<int> &ids, bool front)
{
    if (S.order == ORDER_FORWARD && !front) {
        for (int t : ids) {
            S.fibers[t]->state = RUN;
            S.queue.push_back(t);
        }
        return;
    }
    if (S.order == ORDER_REVERSE)
        std::reverse(ids.begin(), ids.end());
    else if (S.order == ORDER_RANDOM)
        std::shuffle(ids.begin(), ids.end(), S.rng);
    else if (S.order == ORDER_AHEAD) {
        int a = ahead_warp();
        std::stable_partition(ids.begin(), ids.end(), [a](int t) { return t / 32 == a; });
    }
    for (int t : ids)
        S.fibers[t]->state = RUN;
    if (front) {
        S.queue.erase(S.queue.begin(), S.queue.begin() + (long)S.qhead);
        S.qhead = 0;
        S.queue.insert(S.queue.begin(), ids.begin(), ids.end());
    } else {
        S.queue.insert(S.queue.end(), ids.begin(), ids.end());
    }
}

IG_EMU_HOT bool warp_ready(int w)
{
    return S.warps[w].waiting > 0 && S.warps[w].waiting == S.warps[w].live;
}

IG_EMU_HOT void release_warp(int w, bool front)
{
    static std::vector<int> ids;
    ids.clear();
    for (int t = w * 32; t < std::min(S.nthreads, w * 32 + 32); t++)
        if (S.fibers[t]->state == WAIT_WARP)
            ids.push_back(t);
    S.warps[w].waiting = 0;
    release(ids, front);
}

[[noreturn]] void deadlock()
{
    fprintf(stderr,
            "cuda-emu: %s: deadlock in block (%u,%u,%u): no thread can pass its barrier "
            "(%d live, %d at __syncthreads; a shuffle or barrier in divergent code?)\n",
            S.name, block_idx.x, block_idx.y, block_idx.z, S.live, S.waiting_block);
    for (int t = 0; t < S.nthreads; t++)
        if (S.fibers[t]->state != DONE)
            fprintf(stderr, "  thread %d: %s\n", t,
                    S.fibers[t]->state == WAIT_BLOCK ? "__syncthreads" : "warp shuffle");
    abort();
}

/* The next fiber to run: the queue's head, else the warps whose live lanes
 * all wait at a shuffle, else (all live threads at __syncthreads) the
 * block; NULL when every thread has returned. */
IG_EMU_HOT fiber_s *pick_next()
{
    int nw = (S.nthreads + 31) / 32;
    for (;;) {
        if (S.qhead < S.queue.size())
            return S.fibers[S.queue[S.qhead++]];
        S.queue.clear();
        S.qhead = 0;
        static std::vector<int> ws;
        ws.clear();
        for (int w = 0; w < nw; w++)
            if (warp_ready(w))
                ws.push_back(w);
        if (S.order == ORDER_REVERSE)
            std::reverse(ws.begin(), ws.end());
        else if (S.order == ORDER_RANDOM)
            std::shuffle(ws.begin(), ws.end(), S.rng);
        for (int w : ws)
            release_warp(w, false);
        if (!ws.empty())
            continue;
        if (S.live == 0)
            return NULL;
        if (S.waiting_block == S.live) {
            static std::vector<int> ids;
            ids.clear();
            for (int t = 0; t < S.nthreads; t++)
                if (S.fibers[t]->state == WAIT_BLOCK)
                    ids.push_back(t);
            S.waiting_block = 0;
            release(ids, false);
            continue;
        }
        deadlock();
    }
}

/* Scheduler -> the block's first fiber; returns when the block is done. */
IG_EMU_HOT void enter(fiber_s *f)
{
    current = f;
    S.from_sched = true;
#if IG_EMU_ASAN
    __sanitizer_start_switch_fiber(&S.sched_fake, f->lo, STACK_BYTES);
#endif
#if defined(__x86_64__)
    ig_emu_switch(&S.sched_sp, f->sp);
#else
    swapcontext(&S.sched_uc, &f->uc);
#endif
#if IG_EMU_ASAN
    __sanitizer_finish_switch_fiber(S.sched_fake, NULL, NULL);
#endif
}

/* The running fiber f has blocked (or returned, dying): hands over to the
 * next runnable fiber directly, or back to the scheduler when the block is
 * done. Returns when f runs again. */
IG_EMU_HOT void leave(fiber_s *f, bool dying)
{
    if (S.order == ORDER_AHEAD) {
        int a = ahead_warp();
        if (warp_ready(a))
            release_warp(a, true);
    }
    fiber_s *next = pick_next();
    if (next == f)
        return; /* released already: runs on without a switch */
    current = next;
#if IG_EMU_ASAN
    if (next)
        __sanitizer_start_switch_fiber(dying ? NULL : &f->asan_fake, next->lo, STACK_BYTES);
    else
        __sanitizer_start_switch_fiber(dying ? NULL : &f->asan_fake, S.sched_bottom,
                                       S.sched_size);
#endif
#if defined(__x86_64__)
    ig_emu_switch(&f->sp, next ? next->sp : S.sched_sp);
#else
    swapcontext(&f->uc, next ? &next->uc : &S.sched_uc);
#endif
#if IG_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, NULL, NULL);
#endif
}

void fiber_main()
{
#if IG_EMU_ASAN
    const void *bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (S.from_sched) { /* the scheduler's stack, to switch back to */
        S.sched_bottom = bottom;
        S.sched_size = size;
    }
#endif
    S.from_sched = false;
    fiber_s *f = (fiber_s *)current;
    S.body(S.ctx);
    f->state = DONE;
    S.live--;
    warp_s &w = S.warps[f->tid / 32];
    w.live--;
    leave(f, true);
    abort(); /* a finished fiber is never resumed */
}

IG_EMU_HOT void run_block()
{
    int nw = (S.nthreads + 31) / 32;
    S.warps.assign(nw, warp_s{0, 0});
    S.xchg[0].assign(S.nthreads, 0);
    S.xchg[1].assign(S.nthreads, 0);
    S.xseq[0].assign(S.nthreads, ~0u);
    S.xseq[1].assign(S.nthreads, ~0u);
    S.queue.clear();
    S.qhead = 0;
    S.live = S.nthreads;
    S.waiting_block = 0;
    static std::vector<int> all;
    all.clear();
    for (int t = 0; t < S.nthreads; t++) {
        fiber_s *f = fiber_get(t);
        f->tid = t;
        fiber_reset(f);
        f->idx = uint3{(unsigned)t % block_dim.x, (unsigned)t / block_dim.x % block_dim.y,
                       (unsigned)t / (block_dim.x * block_dim.y)};
        f->state = WAIT_BLOCK;
        f->nxchg = 0;
        S.warps[t / 32].live++;
        all.push_back(t);
    }
    if (S.smem_bytes)
        memset(S.smem, 0xff, S.smem_bytes); /* uninitialised shared memory reads as NaN */
    release(all, false);
    all.clear();
    /* The fibers hand over to each other (leave()); control comes back here
     * when the block is done. */
    fiber_s *first = pick_next();
    if (first)
        enter(first);
}

} // namespace

/* ---- what the kernels call -------------------------------------------------- */

IG_EMU_HOT void syncthreads()
{
    fiber_s *f = (fiber_s *)current;
    f->state = WAIT_BLOCK;
    S.waiting_block++;
    leave(f, false);
}

IG_EMU_HOT uint64_t warp_exchange(uint64_t v, int mode, int arg, int width)
{
    fiber_s *f = (fiber_s *)current;
    int lane = f->tid & 31, base = f->tid - lane, w = f->tid / 32;
    unsigned seq = f->nxchg++, buf = seq & 1;
    const uint64_t *slot = S.xchg[buf].data() + base;
    S.xchg[buf][f->tid] = v;
    S.xseq[buf][f->tid] = seq;
    f->state = WAIT_WARP;
    S.warps[w].waiting++;
    leave(f, false); /* every live lane has deposited when this returns */
    uint64_t r;
    int seg = lane - lane % width, src = lane;
    switch (mode) {
    case XCHG_XOR:
        src = lane ^ arg;
        if (src >= seg + width)
            src = lane;
        r = slot[src];
        break;
    case XCHG_DOWN:
        src = lane + arg < seg + width ? lane + arg : lane;
        r = slot[src];
        break;
    case XCHG_UP:
        src = lane - arg >= seg ? lane - arg : lane;
        r = slot[src];
        break;
    case XCHG_IDX:
        src = seg + ((arg % width) + width) % width;
        r = slot[src];
        break;
    default: {
        unsigned bits = 0;
        int n = std::min(32, S.nthreads - base), live = 0;
        for (int i = 0; i < n; i++) {
            if (S.xseq[buf][base + i] != seq)
                continue;
            live++;
            if (slot[i])
                bits |= 1u << i;
        }
        r = mode == XCHG_BALLOT ? bits
            : mode == XCHG_ANY  ? bits != 0
                                : (unsigned)__builtin_popcount(bits) == (unsigned)live;
    }
    }
    if (base + src >= S.nthreads || S.xseq[buf][base + src] != seq)
        fail("%s: thread %d reads a shuffle value from lane %d, which did not take part (it has "
             "exited or is elsewhere)", S.name, f->tid, src);
    return r;
}

void *dynamic_smem()
{
    return S.smem;
}

cudaError_t run(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, void (*body)(void *), void *ctx)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    configure();
    counters.launches++;
    int dev = stream_device(stream);
    if (dev < 0)
        return set_error(cudaErrorInvalidResourceHandle);
    size_t nthreads = (size_t)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || nthreads == 0 || nthreads > 1024 ||
        grid.y > 65535 || grid.z > 65535 || block.z > 64) {
        fprintf(stderr, "cuda-emu: %s: launch of grid (%u,%u,%u) x block (%u,%u,%u) is invalid\n",
                name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return set_error(cudaErrorInvalidConfiguration);
    }
    if (smem > func_smem_limit(fn)) {
        fprintf(stderr, "cuda-emu: %s: %zu bytes of dynamic shared memory over the kernel's "
                        "limit of %zu (cudaFuncSetAttribute)\n", name, smem, func_smem_limit(fn));
        return set_error(cudaErrorInvalidValue);
    }
    if (take_fault(name)) {
        post_async_error(dev, cudaErrorLaunchFailure);
        return cudaSuccess;
    }
    S.name = name;
    S.body = body;
    S.ctx = ctx;
    S.nthreads = (int)nthreads;
    block_dim = block;
    grid_dim = grid;
    S.smem_bytes = smem;
    S.smem = smem ? (unsigned char *)malloc(smem) : NULL; /* exact size: ASan sees overruns */
    std::vector<uint3> blocks;
    blocks.reserve((size_t)grid.x * grid.y * grid.z);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++)
                blocks.push_back(uint3{x, y, z});
    if (S.order == ORDER_REVERSE)
        std::reverse(blocks.begin(), blocks.end());
    else if (S.order == ORDER_RANDOM)
        std::shuffle(blocks.begin(), blocks.end(), S.rng);
    open_device();
    for (const uint3 &b : blocks) {
        block_idx = b;
        run_block();
    }
    close_device();
    free(S.smem);
    S.smem = NULL;
    current = NULL;
    return cudaSuccess;
}

} // namespace ig_emu

extern "C" const char *ig_cuda_emu_order(void)
{
    std::lock_guard<std::recursive_mutex> g(ig_emu::lock);
    ig_emu::configure();
    return ig_emu::S.order_name;
}
