/* http_util.c - raw HTTP for in-process server tests. */
#include "http_util.h"
#include "test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int http_open(int port, const char *method, const char *path, const char *headers,
              const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n", method, path, headers ? headers : "",
                     body ? strlen(body) : 0);
    CHECK(write(fd, head, (size_t)n) == n);
    if (body && *body)
        CHECK(write(fd, body, strlen(body)) == (ssize_t)strlen(body));
    return fd;
}

int http_request(int port, const char *method, const char *path, const char *headers,
                 const char *body, char *out, size_t cap)
{
    int fd = http_open(port, method, path, headers, body);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(fd, out + len, cap - len - 1)) > 0)
        len += (size_t)got;
    out[len] = '\0';
    close(fd);
    int status = 0;
    CHECK(sscanf(out, "HTTP/1.1 %d", &status) == 1);
    return status;
}
