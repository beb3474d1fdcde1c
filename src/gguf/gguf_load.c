/* gguf_load.c - how a GGUF file gets into memory for the reader: mapped (shared with the page
 * cache), or read into anonymous memory on 2 MiB huge pages when transparent huge pages are on
 * and the copy leaves 1/8 of MemAvailable to the rest of the system; also a caller's buffer.
 * The bytes are then handed to ps_gguf_parse (gguf_read.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_internal.h"

#define HUGE_BYTES ((size_t)2 << 20)

/* Whether transparent huge pages back memory that asks for them (enabled: always or madvise). */
static bool huge_pages_on(void) {
#ifdef MADV_HUGEPAGE
    char line[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && !fgets(line, sizeof line, f)) line[0] = 0;
    if (f) fclose(f);
    return strstr(line, "[always]") || strstr(line, "[madvise]");
#else
    return false;
#endif
}

/* Whether a copy of size bytes leaves at least 1/8 of the memory the system could give now
 * (MemAvailable) to everything else; else the file is mapped, and the kernel pages it. */
static bool copy_fits(size_t size) {
    unsigned long long kb = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (double)size < 0.875 * (double)kb * 1024;
}

/* Reads the size bytes of fd into anonymous memory aligned to 2 MiB and advised to use huge
 * pages, read-only afterwards; *region and *region_len are what close unmaps. */
static ps_status read_huge(int fd, const char *path, size_t size, const uint8_t **base, void **region,
                           size_t *region_len, char *err, size_t errlen) {
#ifdef MADV_HUGEPAGE
    size_t len = size + HUGE_BYTES;
    uint8_t *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return ps_errf(err, errlen, PS_ERR_NOMEM, "cannot allocate %zu bytes for '%s': %s", size, path,
                       strerror(errno));
    uint8_t *p = (uint8_t *)(((uintptr_t)r + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    madvise(p, size, MADV_HUGEPAGE); /* hints: without them, normal pages, and a forked child's copy */
    madvise(r, len, MADV_DONTFORK);
    for (size_t got = 0; got < size;) {
        ssize_t n = pread(fd, p + got, size - got < ((size_t)1 << 30) ? size - got : (size_t)1 << 30, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ps_status s = ps_errf(err, errlen, PS_ERR_IO, "cannot read '%s': %s", path,
                                  n < 0 ? strerror(errno) : "the file shrank while it was read");
            munmap(r, len);
            return s;
        }
        got += (size_t)n;
    }
    mprotect(p, size, PROT_READ);
    *base = p, *region = r, *region_len = len;
    return PS_OK;
#else
    (void)fd, (void)size, (void)base, (void)region, (void)region_len;
    return ps_errf(err, errlen, PS_ERR_UNSUPPORTED, "'%s': huge pages are not supported here", path);
#endif
}

/* Opens and validates the GGUF file at path: see gguf.h. The descriptor is closed before
 * returning. Errors name the path. */
ps_status ps_gguf_open_with(const char *path, ps_gguf_load how, ps_gguf **out, char *err, size_t errlen) {
    ps_status s;
    char detail[512];
    const uint8_t *base = NULL;
    void *region = NULL;
    size_t size = 0, region_len = 0;
    int fd = -1;
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open: path is NULL");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
        goto err;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        s = ps_errf(err, errlen, PS_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        goto err;
    }
    if (!S_ISREG(st.st_mode)) {
        s = ps_errf(err, errlen, PS_ERR_IO, "'%s' is not a regular file", path);
        goto err;
    }
    if ((uint64_t)st.st_size > SIZE_MAX - HUGE_BYTES) {
        s = ps_errf(err, errlen, PS_ERR_IO, "'%s' is too large to map", path);
        goto err;
    }
    size = (size_t)st.st_size;
    char magic[4] = "";
    bool huge = size > 0 && how == PS_GGUF_HUGE && huge_pages_on() && copy_fits(size) && pread(fd, magic, 4, 0) == 4 &&
                !memcmp(magic, GGUF_MAGIC, 4); /* else mapped (the parser
                                                  says what is wrong) */
    if (huge && (s = read_huge(fd, path, size, &base, &region, &region_len, err, errlen)) != PS_ERR_NOMEM && s)
        goto err;
    if (size > 0 && !region) { /* mapped by choice, or because memory for a copy was short */
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            s = ps_errf(err, errlen, PS_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
            goto err;
        }
        base = map, region = map, region_len = size;
    }
    close(fd);
    fd = -1;
    s = ps_gguf_parse(size ? base : (const uint8_t *)"", size, out, detail, sizeof detail);
    if (s) {
        ps_errf(err, errlen, s, "%s: %s", path, detail);
        goto err;
    }
    (*out)->region = region;
    (*out)->region_len = region_len;
    return PS_OK;
err:
    if (region) munmap(region, region_len);
    if (fd >= 0) close(fd);
    return s;
}

/* ps_gguf_open_with(PS_GGUF_MAP): see gguf.h. */
ps_status ps_gguf_open(const char *path, ps_gguf **out, char *err, size_t errlen) {
    return ps_gguf_open_with(path, PS_GGUF_MAP, out, err, errlen);
}

/* Validates the GGUF image in buf: see gguf.h. The reader points into buf, which the caller
 * keeps alive (and unchanged) until ps_gguf_close. */
ps_status ps_gguf_open_mem(const void *buf, size_t len, ps_gguf **out, char *err, size_t errlen) {
    if (!out) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open_mem: out is NULL");
    *out = NULL;
    if (!buf && len) return ps_errf(err, errlen, PS_ERR_ARG, "ps_gguf_open_mem: buf is NULL");
    return ps_gguf_parse(buf ? buf : "", len, out, err, errlen);
}
