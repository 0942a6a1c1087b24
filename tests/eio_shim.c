#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* write() and pwrite() fail with EIO on files under $EIO_UNDER once $EIO_AFTER writes there have
   succeeded: a disk going bad under one directory, the rest of the process untouched (stdout,
   sockets, pipes). Built by tests/disk_faults.py; used as LD_PRELOAD by tests and bench/. */
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static long seen;
static int failing(int fd) {
    const char *prefix = getenv("EIO_UNDER");
    char link[64], path[4096];
    if (!prefix) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    if (k <= 0) return 0;
    path[k] = 0;
    if (strncmp(path, prefix, strlen(prefix)) != 0) return 0;
    return __atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST) > atol(getenv("EIO_AFTER") ? getenv("EIO_AFTER") : "0");
}
ssize_t write(int fd, const void *buf, size_t n) {
    if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
    if (failing(fd)) { errno = EIO; return -1; }
    return real_write(fd, buf, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    if (!real_pwrite) real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    if (failing(fd)) { errno = EIO; return -1; }
    return real_pwrite(fd, buf, n, off);
}
