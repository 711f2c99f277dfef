// Linux-only calls the Glibc module does not export: epoll, eventfd, accept4, sendfile.
#ifndef CHTTPLINUX_SHIM_H
#define CHTTPLINUX_SHIM_H

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

// accept4 is declared only under _GNU_SOURCE, which the Glibc module is built without.
extern int accept4(int sockfd, struct sockaddr *addr, socklen_t *addrlen, int flags);

static inline int chttp_epoll_data_fd(const struct epoll_event *event) { return event->data.fd; }

#endif
