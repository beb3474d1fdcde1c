/* cpu.c - CPU feature detection (cpuid + xgetbv on x86, the OS's hwcaps on aarch64) and
 * the lookup of ps_matmul's kernel families (q8_kern.h). */
#include "cpu.h"

#include <stdatomic.h>
#include <unistd.h>

#include "q8_kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define PS_X86 1
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

// Detection

/* What this CPU offers, as far as the OS lets us use it. */
typedef struct {
    bool avx2, fma, f16c;             /* with OS support for ymm state */
    bool avx512f, avx512bw, avx512vl; /* with OS support for zmm/opmask state */
    bool avx512dq, avx512vnni, avx512vbmi;
    bool avx512bitalg, avx512bf16;
    bool amx;      /* AMX tiles with int8 products, and the OS's leave to use them */
    bool neon;     /* aarch64 Advanced SIMD */
    bool neon_dot; /* ARMv8.2 dot product (sdot), as the OS reports it */
    size_t l1d;    /* L1 data cache bytes a core (0: not reported) */
} cpu_features;

#ifdef PS_X86
/* XCR0: which register states the OS saves (so that using them is safe). */
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* Linux hands out the tile registers' 8 KiB of state only on request (once, for the whole
 * process); other systems are not asked, and AMX stays unused there. */
static bool amx_permitted(void) {
#if defined(__x86_64__) && defined(__linux__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

/* Fills f from cpuid leaves 1 and 7, keeping only what the OS enabled. */
static void detect_x86(cpu_features *f) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & (1u << 27), avx = c & (1u << 28);
    bool fma = c & (1u << 12), f16c = c & (1u << 29);
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    bool ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!ymm_ok || __get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = b & (1u << 5);
    f->fma = fma;
    f->f16c = f16c;
    if (!zmm_ok) return;
    f->avx512f = b & (1u << 16);
    f->avx512dq = b & (1u << 17);
    f->avx512bw = b & (1u << 30);
    f->avx512vl = b & (1u << 31);
    f->avx512vbmi = c & (1u << 1);
    f->avx512vnni = c & (1u << 11);
    f->avx512bitalg = c & (1u << 12);
    bool amx = (d & (1u << 24)) && (d & (1u << 25)); /* AMX-TILE, AMX-INT8 */
    __cpuid_count(7, 1, a, b, c, d);
    f->avx512bf16 = a & (1u << 5);
    f->amx = amx && (xcr0 & 0x60000) == 0x60000 && amx_permitted();
}
#endif

#ifdef __aarch64__
/* Whether the cores have the ARMv8.2 dot product (sdot/udot). Compile-time flags are not
 * enough: the usual build targets plain ARMv8-A and picks the kernels at run time. */
static bool detect_arm_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v;
#elif defined(__ARM_FEATURE_DOTPROD)
    return true;
#else
    return false;
#endif
}
#endif

static cpu_features g_features;
static atomic_int g_features_state; /* 0 unknown, 1 being filled, 2 ready */

/* Features of this CPU, detected once (thread-safe after the first call returns).
 * Detection is idempotent, so racing first callers may each fill a local copy; the
 * first to finish publishes it. */
static const cpu_features *cpu_features_get(void) {
    if (atomic_load_explicit(&g_features_state, memory_order_acquire) == 2) return &g_features;
    cpu_features f = {0};
#ifdef PS_X86
    detect_x86(&f);
#endif
#if defined(__ARM_NEON) || defined(__aarch64__)
    f.neon = true;
#endif
#ifdef __aarch64__
    f.neon_dot = detect_arm_dotprod();
#endif
#ifdef _SC_LEVEL1_DCACHE_SIZE
    long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    f.l1d = l1d > 0 ? (size_t)l1d : 0;
#endif
    int expect = 0;
    if (atomic_compare_exchange_strong(&g_features_state, &expect, 1)) {
        g_features = f;
        atomic_store_explicit(&g_features_state, 2, memory_order_release);
    } else {
        while (atomic_load_explicit(&g_features_state, memory_order_acquire) != 2) {}
    }
    return &g_features;
}

// Families

static const char *const isa_names[PS_ISA_COUNT] = {
    [PS_ISA_REF] = "ref",
    [PS_ISA_AVX2] = "avx2",
    [PS_ISA_AVX512] = "avx512",
    [PS_ISA_AVX512VNNI] = "avx512vnni",
    [PS_ISA_NEON] = "neon",
    [PS_ISA_NEONDOT] = "neondot",
    [PS_ISA_AVX512AMX] = "avx512amx",
};

const char *ps_isa_name(ps_isa isa) { return (unsigned)isa < PS_ISA_COUNT ? isa_names[isa] : "unknown"; }

size_t ps_cpu_l1d_bytes(void) { return cpu_features_get()->l1d; }

bool ps_isa_available(ps_isa isa) {
    const cpu_features *f = cpu_features_get();
    bool avx2 = f->avx2 && f->fma && f->f16c;
    bool avx512 = avx2 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
    switch (isa) {
    case PS_ISA_REF: return true;
    case PS_ISA_AVX2: return avx2;
    case PS_ISA_AVX512: return avx512;
    case PS_ISA_AVX512VNNI: return avx512 && f->avx512vnni && f->avx512vbmi && f->avx512bitalg;
    case PS_ISA_AVX512AMX: return ps_isa_available(PS_ISA_AVX512VNNI) && f->amx;
    case PS_ISA_NEON: return f->neon;
    case PS_ISA_NEONDOT: return f->neon && f->neon_dot;
    default: return false;
    }
}

ps_isa ps_isa_best(void) {
    static const ps_isa order[] = {PS_ISA_AVX512AMX, PS_ISA_AVX512VNNI, PS_ISA_AVX512,
                                   PS_ISA_AVX2,      PS_ISA_NEONDOT,    PS_ISA_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (ps_isa_available(order[i])) return order[i];
    return PS_ISA_REF;
}

/* Each family's table of kernels, indexed by ps_type. */
static const ps_q8_kern *const q8_tables[PS_ISA_COUNT] = {
    [PS_ISA_REF] = ps_q8_ref_kerns,
    [PS_ISA_AVX2] = ps_q8_avx2_kerns,
    [PS_ISA_AVX512] = ps_q8_avx512_kerns,
    [PS_ISA_AVX512VNNI] = ps_q8_avx512vnni_kerns,
    [PS_ISA_NEON] = ps_q8_neon_kerns,
    [PS_ISA_NEONDOT] = ps_q8_neondot_kerns,
    [PS_ISA_AVX512AMX] = ps_q8_avx512amx_kerns,
};

/* The family's own table entry for t (no fallback); NULL when the row is empty. */
static const ps_q8_kern *family_kernel(ps_isa isa, uint32_t t) {
    if ((unsigned)isa >= PS_ISA_COUNT || t >= PS_TYPE_COUNT) return NULL;
    const ps_q8_kern *k = &q8_tables[isa][t];
    return k->gemm ? k : NULL;
}

/* Falls back amx -> vnni -> avx512 -> avx2 -> ref (neondot -> neon -> ref) until a family has
 * type t. */
const ps_q8_kern *ps_q8_kern_get(ps_isa isa, uint32_t t) {
    for (;;) {
        const ps_q8_kern *k = family_kernel(isa, t);
        if (k || isa == PS_ISA_REF) return k;
        isa = isa == PS_ISA_AVX512AMX    ? PS_ISA_AVX512VNNI
              : isa == PS_ISA_AVX512VNNI ? PS_ISA_AVX512
              : isa == PS_ISA_AVX512     ? PS_ISA_AVX2
              : isa == PS_ISA_NEONDOT    ? PS_ISA_NEON
                                         : PS_ISA_REF;
    }
}
