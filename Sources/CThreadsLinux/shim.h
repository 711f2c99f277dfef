// Linux scheduling calls that glibc (before 2.41) neither declares nor wraps: sched_getattr(2), sched_setattr(2).
#ifndef CTHREADSLINUX_SHIM_H
#define CTHREADSLINUX_SHIM_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

// struct sched_attr of sched_setattr(2), SCHED_ATTR_SIZE_VER1.
struct cthreads_sched_attr {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;
    uint64_t sched_deadline;
    uint64_t sched_period;
    uint32_t sched_util_min;
    uint32_t sched_util_max;
};

// The calling thread's scheduling attributes; 0, or -1 with errno.
static inline int cthreads_get_attr(struct cthreads_sched_attr *attr) {
#if defined(__linux__) && defined(SYS_sched_getattr)
    memset(attr, 0, sizeof *attr);
    return (int)syscall(SYS_sched_getattr, 0, attr, (unsigned)sizeof *attr, 0U);
#else
    errno = ENOSYS;
    return -1;
#endif
}

// Sets the calling thread's attributes; 0, or -1 with errno.
static inline int cthreads_set_attr(struct cthreads_sched_attr *attr) {
#if defined(__linux__) && defined(SYS_sched_setattr)
    attr->size = (uint32_t)sizeof *attr;
    return (int)syscall(SYS_sched_setattr, 0, attr, 0U);
#else
    errno = ENOSYS;
    return -1;
#endif
}

#endif
