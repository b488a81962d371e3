/* The stepped clock of lease-test-servers (see clock.rs): adds the offset in whole
   seconds read from $LEASE_CLOCK_FILE (at most every 5 ms) to the wall clock. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ns;
static long long next_read_ns;

static long long mono_ns(void) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void refresh(void) {
    long long now = mono_ns();
    if (now < __atomic_load_n(&next_read_ns, __ATOMIC_RELAXED)) return;
    __atomic_store_n(&next_read_ns, now + 5000000LL, __ATOMIC_RELAXED);
    const char *path = getenv("LEASE_CLOCK_FILE");
    if (!path) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    __atomic_store_n(&offset_ns, strtoll(buf, NULL, 10) * 1000000000LL, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    refresh();
    long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
    ts->tv_sec = t / 1000000000LL;
    ts->tv_nsec = t % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    if (!tv) return 0;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
